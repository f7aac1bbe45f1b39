"""A real OpenAI-style SSE server on 127.0.0.1 for the chat tests: it streams the reply piece by
piece (``data: {json}`` lines, then ``data: [DONE]``), records every request body, and can hold
the stream after the first piece until the test says go (to prove tokens arrive as streamed)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.go = threading.Event()
        self.go.set()
        self.finished = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                self._json(200, {"object": "list", "data": [{"id": "tiny-test", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                last = body["messages"][-1]["content"]
                if last == "status500":
                    self._json(500, {"error": {"message": "model exploded"}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if last == "boom":
                    self._event({"error": {"message": "context overflow", "code": 400}})
                    return
                # the reply: how many user turns the server saw, then the words reversed
                turns = sum(1 for m in body["messages"] if m["role"] == "user")
                pieces = [f"[{turns}]"] + [f" {w}" for w in reversed(last.split())]
                self.wfile.write(b": keep-alive comment\n\n")
                for i, piece in enumerate(pieces):
                    chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": piece}}]}
                    if i == 0:
                        chunk["choices"][0]["delta"]["role"] = "assistant"
                    self._event(chunk)
                    if i == 0:
                        outer.go.wait(30)
                    time.sleep(0.01)
                self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                outer.finished.set()

            def _event(self, data: dict[str, Any]) -> None:
                self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

            def _json(self, status: int, data: dict[str, Any]) -> None:
                raw = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self.httpd.shutdown()
        self.httpd.server_close()
