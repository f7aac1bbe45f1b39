"""A real `provision api` server in a subprocess on 127.0.0.1, and a small stdlib HTTP client for it."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import gone

LISTENING = re.compile(r"listening on http://([0-9.]+):(\d+)")


@dataclass
class Api:
    proc: subprocess.Popen[str]
    host: str
    port: int
    log: list[str] = field(default_factory=list)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1800)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        text = resp.read()
        conn.close()
        try:
            parsed: Any = json.loads(text)
        except ValueError:
            parsed = text
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed

    def tail(self, lines: int = 80) -> str:
        """The server's last log lines, for an assertion message: a 500 names a job whose traceback is there."""
        return "".join(self.log[-lines:])

    def execute(self, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", "/api/v1/execute", body)

    @contextmanager
    def stream(self, body: dict[str, Any]) -> Iterator[tuple[http.client.HTTPResponse, Iterator[tuple[float, dict]]]]:
        """The open response and its records, each with the time this client received it."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=1800)
        conn.request(
            "POST", "/api/v1/execute/stream", body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()

        def records() -> Iterator[tuple[float, dict]]:
            while True:
                line = resp.readline()
                if not line:
                    return
                yield time.monotonic(), json.loads(line)

        try:
            yield resp, records()
        finally:
            conn.close()

    def children(self) -> list[int]:
        """Processes whose parent is the server (QEMU runs as one, through the chroot wrapper),
        less the server's reaper, which lives exactly as long as the server (adapters/reaper.py)."""
        kids = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.proc.pid and not _is_reaper(int(d)):
                kids.append(int(d))
        return kids


@contextmanager
def api_server(
    *args: str, listen: str = "127.0.0.1:0", env: dict[str, str] | None = None, timeout: float = 60
) -> Iterator[Api]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision", "api", "--listen", listen, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stderr is not None
    log: list[str] = []
    deadline = time.monotonic() + timeout
    m = None
    while m is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = LISTENING.search(line)
    assert m, f"the server did not start: {''.join(log)}"
    api = Api(proc, m.group(1), int(m.group(2)), log)
    # Keep reading its log so the pipe never fills.
    threading.Thread(target=lambda: [log.append(x) for x in proc.stderr or []], daemon=True).start()
    try:
        yield api
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_gone(pid: int, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if gone(pid):
            return True
        time.sleep(0.2)
    return gone(pid)


def _is_reaper(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"provision.adapters.reaper" in argv
