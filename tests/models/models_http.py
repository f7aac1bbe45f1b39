"""A real HTTP/1.1 server on loopback for the model store tests, with scripted misbehaviour.

Each request takes the next plan from ``server.plans`` (then "normal"): normal (Range and
If-Range honoured, strong ETag), status:N, ignore_range, reset_at:K (RST after absolute byte K),
truncate_at:K (clean close after byte K despite Content-Length), pause_at:K (stall after byte K
until ``server.release`` is set), huge_length (claims 2**60 bytes), chunked (the whole file in
Transfer-Encoding: chunked, no Content-Length, odd piece sizes). Every request is recorded
with its Range/If-Range headers, status and the body bytes actually sent.

Fault modes for the bad-input suite (a server that would keep a careless client busy forever):
restart_close:K (ignore Range, send from byte 0, close after K bytes), from_zero:K (answer a
Range with a 206 whose Content-Range starts at 0, close after K bytes), wrong_range (a 206 whose
Content-Range is not the asked one), silent (accept, read the request, never answer until
released), drip:D (the whole file in 4 KiB pieces, D seconds apart), garbage (a line that is
no HTTP status line), hangup (close without a word), status:N (e.g. 500s).

Registries (tests/models/registries.py): ``path_plans`` script one path's requests (a blob's)
ahead of ``plans``; with ``token`` set every /v2/ path wants ``Authorization: Bearer TOKEN`` and
answers 401 with a Bearer challenge naming ``/token`` (which wants ``users`` Basic credentials
when some are set); ``types`` gives a path's Content-Type; a path is looked up with its query
string first, then without.
"""

from __future__ import annotations

import base64
import hashlib
import json
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
    authorization: str | None = None
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
    path_plans: dict[str, list[str]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    users: dict[str, str] = field(default_factory=dict)

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

    def next_plan(self, path: str = "") -> str:
        with self.lock:
            if self.path_plans.get(path):
                return self.path_plans[path].pop(0)
            return self.plans.pop(0) if self.plans else "normal"

    def lookup(self, path: str) -> bytes | None:
        return self.files.get(path, self.files.get(path.split("?", 1)[0]))


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output clean
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            auth = self.headers.get("Authorization")
            rec = Record(self.path, self.headers.get("Range"), self.headers.get("If-Range"), auth)
            with server.lock:
                server.requests.append(rec)
            if self._refused_auth(rec, auth):
                return None
            plan = server.next_plan(self.path.split("?", 1)[0])
            kind, _, arg = plan.partition(":")
            if kind == "status":
                return self._small(rec, int(arg))
            if kind == "silent":
                rec.status = -1
                server.paused.set()
                server.release.wait(30)
                self.close_connection = True
                return None
            if kind == "hangup":
                self.close_connection = True
                return None
            if kind == "garbage":
                self.wfile.write(b"NOT-HTTP \x00\xff nonsense\r\n\r\n")
                self.close_connection = True
                return None
            if kind == "redirect":
                rec.status = 302
                self.send_response(302)
                self.send_header("Location", arg)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            body = server.lookup(self.path)
            if body is None:
                return self._small(rec, 404)
            if kind == "huge_length":
                rec.status = 200
                self.send_response(200)
                self.send_header("Content-Length", str(2**60))
                self.end_headers()
                self.close_connection = True
                return None
            if kind == "chunked":  # no length up front: the client cannot read straight into its buffers
                rec.status = 200
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                pos, piece = 0, 1
                while pos < len(body):
                    n = min(piece, len(body) - pos)
                    self.wfile.write(b"%x\r\n" % n + body[pos : pos + n] + b"\r\n")
                    rec.sent += n
                    pos, piece = pos + n, piece * 3 + 7  # 1, 10, 37, ... up to CHUNK-sized pieces
                    piece = min(piece, CHUNK + 13)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return None
            start = 0
            rng = self.headers.get("Range")
            if_range = self.headers.get("If-Range")
            honour = kind not in ("ignore_range", "restart_close") and rng and rng.startswith("bytes=")
            honour = honour and if_range in (None, server.etag)
            if kind == "from_zero" and rng:
                rec.status = 206
                self.send_response(206)
                self.send_header("Content-Range", f"bytes 0-{len(body) - 1}/{len(body)}")
            elif kind == "wrong_range" and rng:
                rec.status = 206
                self.send_response(206)
                self.send_header("Content-Range", f"bytes 7-{len(body) + 7}/{len(body) + 8}")
            elif honour and rng:
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
            self.send_header("Content-Type", server.types.get(self.path.split("?", 1)[0], "application/octet-stream"))
            self.send_header("ETag", server.etag)
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            stop = len(body)
            if kind in ("reset_at", "truncate_at", "pause_at") or (kind in ("restart_close", "from_zero") and arg):
                stop = max(int(arg), start)
            step, delay = CHUNK, server.delay_per_chunk
            if kind == "drip":
                step, delay = 4096, float(arg)
            pos = start
            try:
                while pos < stop:
                    n = min(step, stop - pos)
                    self.wfile.write(body[pos : pos + n])
                    self.wfile.flush()
                    rec.sent += n
                    pos += n
                    if delay:
                        time.sleep(delay)
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
                elif kind in ("truncate_at", "restart_close", "from_zero"):
                    self.close_connection = True
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
            return None

        def _refused_auth(self, rec: Record, auth: str | None) -> bool:
            """The registry's bearer-token flow (only with ``server.token`` set)."""
            if server.token is None:
                return False
            path = self.path.split("?", 1)[0]
            if path == "/token":
                want = {"Basic " + base64.b64encode(f"{u}:{p}".encode()).decode() for u, p in server.users.items()}
                if want and auth not in want:
                    self._small(rec, 401)
                    return True
                body = json.dumps({"token": server.token}).encode()
                rec.status = 200
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return True
            if path.startswith("/v2/") and auth != f"Bearer {server.token}":
                host, port = self.server.server_address[:2]
                repo = path[4:].rsplit("/", 2)[0]
                challenge = f'Bearer realm="http://{host}:{port}/token",service="test",scope="repository:{repo}:pull"'
                text = b'{"errors": [{"code": "UNAUTHORIZED"}]}'
                rec.status = 401
                self.send_response(401)
                self.send_header("WWW-Authenticate", challenge)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
                return True
            return False

        def _small(self, rec: Record, status: int) -> None:
            text = f"status {status}\n".encode()
            rec.status = status
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    return Handler


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up on a fault mode is expected; no traceback on the test's stderr


def start(files: dict[str, bytes]) -> ModelServer:
    server = ModelServer(files)
    httpd = _QuietServer(("127.0.0.1", 0), _handler(server))
    httpd.daemon_threads = True
    server.httpd = httpd
    threading.Thread(target=httpd.serve_forever, args=(0.05,), name="model-http", daemon=True).start()
    return server


def stop(server: ModelServer) -> None:
    server.release.set()
    server.httpd.shutdown()
    server.httpd.server_close()
