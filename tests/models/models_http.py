"""A real HTTP/1.1 server on loopback for the model store tests, with scripted misbehaviour.

Each request takes the next plan from ``server.plans`` (then "normal"): normal (Range and
If-Range honoured, strong ETag), status:N, ignore_range, reset_at:K (RST after absolute byte K),
truncate_at:K (clean close after byte K despite Content-Length), pause_at:K (stall after byte K
until ``server.release`` is set), huge_length (claims 2**60 bytes). Every request is recorded
with its Range/If-Range headers, status and the body bytes actually sent.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK = 64 * 1024


def gguf_bytes(size: int, seed: int = 1) -> bytes:
    """GGUF magic followed by deterministic pseudo-random bytes (fast: repeated sha256 blocks)."""
    block = b"".join(hashlib.sha256(f"{seed}:{i}".encode()).digest() for i in range(2048))  # 64 KiB
    body = bytearray(b"GGUF" + struct.pack("<I", 3))
    while len(body) < size:
        body += block
        block = block[1:] + block[:1]
    return bytes(body[:size])


@dataclass
class Record:
    path: str
    range: str | None
    if_range: str | None
    status: int = 0
    sent: int = 0


@dataclass
class ModelServer:
    files: dict[str, bytes]
    etag: str = '"v1-strong"'
    plans: list[str] = field(default_factory=list)
    requests: list[Record] = field(default_factory=list)
    delay_per_chunk: float = 0.0
    release: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    httpd: Any = None

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base + path

    def sent_total(self) -> int:
        return sum(r.sent for r in self.requests)

    def body_requests(self) -> list[Record]:
        return [r for r in self.requests if r.sent > 0]

    def next_plan(self) -> str:
        with self.lock:
            return self.plans.pop(0) if self.plans else "normal"


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output clean
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            rec = Record(self.path, self.headers.get("Range"), self.headers.get("If-Range"))
            with server.lock:
                server.requests.append(rec)
            plan = server.next_plan()
            kind, _, arg = plan.partition(":")
            if kind == "status":
                return self._small(rec, int(arg))
            if kind == "redirect":
                rec.status = 302
                self.send_response(302)
                self.send_header("Location", arg)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            body = server.files.get(self.path)
            if body is None:
                return self._small(rec, 404)
            if kind == "huge_length":
                rec.status = 200
                self.send_response(200)
                self.send_header("Content-Length", str(2**60))
                self.end_headers()
                self.close_connection = True
                return None
            start = 0
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            honour = kind != "ignore_range" and rng and rng.startswith("bytes=") and if_range in (None, server.etag)
            if honour and rng:
                start = int(rng[6:].split("-")[0])
                if start >= len(body):
                    return self._small(rec, 416)
                rec.status = 206
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                rec.status = 200
                self.send_response(200)
            self.send_header("Content-Length", str(len(body) - start))
            self.send_header("ETag", server.etag)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            stop = len(body)
            if kind in ("reset_at", "truncate_at", "pause_at"):
                stop = max(int(arg), start)
            pos = start
            try:
                while pos < stop:
                    n = min(CHUNK, stop - pos)
                    self.wfile.write(body[pos : pos + n])
                    rec.sent += n
                    pos += n
                    if server.delay_per_chunk:
                        time.sleep(server.delay_per_chunk)
                self.wfile.flush()
                if kind == "pause_at":
                    server.paused.set()
                    server.release.wait(30)
                    self.wfile.write(body[pos:])
                    rec.sent += len(body) - pos
                elif kind == "reset_at":
                    # Give the client time to read what was sent (an RST discards its unread receive
                    # buffer), then SO_LINGER 0: close() sends RST, a connection reset mid-body.
                    time.sleep(0.3)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                elif kind == "truncate_at":
                    self.close_connection = True
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            return None

        def _small(self, rec: Record, status: int) -> None:
            text = f"status {status}\n".encode()
            rec.status = status
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    return Handler


def start(files: dict[str, bytes]) -> ModelServer:
    server = ModelServer(files)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.httpd = httpd
    threading.Thread(target=httpd.serve_forever, args=(0.05,), name="model-http", daemon=True).start()
    return server


def stop(server: ModelServer) -> None:
    server.release.set()
    server.httpd.shutdown()
    server.httpd.server_close()
