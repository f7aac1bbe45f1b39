"""An OpenAI-compatible chat client: POST /v1/chat/completions with ``stream: true`` and read the
server-sent events (``data: {json}`` lines, ``data: [DONE]`` at the end) as they arrive.

Over provision's one HTTP adapter. The target is a URL, or the name of one of our serves
(``provision ps``), resolved by ``target_url`` from the entries the caller passes in.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from provision.adapters import http as web
from provision.core.errors import ChatFailed, InvalidValue

Message = dict[str, str]


class Served(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def url(self) -> str: ...


@dataclass(frozen=True)
class Target:
    base: str  # http://127.0.0.1:8080 (no trailing /v1)
    model: str | None  # the served model's name when we know it


def target_url(target: str | None, served: Sequence[Served]) -> Target:
    """A URL as given (its /v1 suffix dropped), else a serve by name; none given: the only serve."""
    if target is None:
        if len(served) == 1:
            return Target(served[0].url, served[0].model)
        names = ", ".join(s.name for s in served) or "none is running"
        raise InvalidValue(
            f"provision chat: which server? ({names})",
            fix="give a NAME from `provision ps` or a URL (http://127.0.0.1:8080)",
        )
    if "://" in target:
        parts = urlsplit(target)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise InvalidValue(
                f"provision chat {target!r}: not an http(s) URL of a server",
                fix="give it as http://HOST:PORT (the /v1 suffix is optional)",
            )
        try:
            port = parts.port
        except ValueError:
            raise InvalidValue(
                f"provision chat {target!r}: bad port", fix="http://HOST:PORT with PORT 1-65535"
            ) from None
        path = parts.path.rstrip("/")
        path = path[: -len("/v1")] if path.endswith("/v1") else path
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return Target(f"{parts.scheme}://{host}{f':{port}' if port else ''}{path}", None)
    for s in served:
        if s.name == target:
            return Target(s.url, s.model)
    running = ", ".join(s.name for s in served) or "none"
    raise InvalidValue(f"no serve named {target!r} is running (running: {running})", fix="provision ps")


def sse_data(lines: Iterable[bytes]) -> Iterator[str]:
    """The payload of every ``data:`` event; comments (``:``) and other fields are skipped."""
    for raw in lines:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line.startswith("data:"):
            yield line[5:].lstrip(" ")


def deltas(events: Iterable[str]) -> Iterator[str]:
    """The content pieces of a streamed chat completion, until ``[DONE]``; an error event is E028."""
    for data in events:
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ChatFailed(f"the server sent an event that is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ChatFailed(f"the server sent an event that is not an object: {data[:200]!r}")
        if "error" in chunk:
            raise ChatFailed(f"the server answered an error mid-stream: {_error_text(chunk['error'])}")
        for choice in chunk.get("choices") or []:
            piece = ((choice or {}).get("delta") or {}).get("content")
            if isinstance(piece, str) and piece:
                yield piece


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)[:300]
    return str(err)[:300]


class ChatClient:
    def __init__(
        self, target: Target, *, model: str | None = None, timeout: float = 300.0, stop: Sequence[str] = ()
    ) -> None:
        self.target = target
        self.model = model or target.model
        self.timeout = timeout
        self.stop = tuple(stop)  # the model's own stop strings (an ollama model's params), sent each time

    def _fail(self, why: str) -> ChatFailed:
        fix = f"is the server up? `provision ps`; curl {self.target.base}/v1/models"
        return ChatFailed(f"{self.target.base}: {why}", fix=fix)

    def served_model(self) -> str:
        """The model to name in requests: the one asked for, ours, or the server's first."""
        if self.model:
            return self.model
        try:
            with web.get(f"{self.target.base}/v1/models", connect_timeout=10, read_timeout=self.timeout) as resp:
                body = resp.read_all()
                status = resp.status
        except (OSError, web.HttpError, http.client.HTTPException) as exc:
            raise self._fail(f"cannot reach it ({exc})") from None
        if status != 200:
            raise self._fail(f"GET /v1/models answered {status}")
        try:
            ids = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError):
            raise self._fail("GET /v1/models did not list models the OpenAI way") from None
        self.model = str(ids[0]) if ids else "default"
        return self.model

    def stream(
        self, messages: Sequence[Message], *, max_tokens: int | None, temperature: float | None
    ) -> Iterator[str]:
        body: dict[str, Any] = {"model": self.served_model(), "messages": list(messages), "stream": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if temperature is not None:
            body["temperature"] = temperature
        if self.stop:
            body["stop"] = list(self.stop)
        try:
            resp = web.post(
                f"{self.target.base}/v1/chat/completions",
                json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
                connect_timeout=10,
                read_timeout=self.timeout,
            )
        except (OSError, web.HttpError, http.client.HTTPException) as exc:
            raise self._fail(f"cannot reach it ({exc})") from None
        with resp:
            if resp.status != 200:
                text = resp.read1(2000).decode(errors="replace")
                raise self._fail(f"POST /v1/chat/completions answered {resp.status}: {text.strip()[:300]}")
            try:
                yield from deltas(sse_data(resp.lines()))
            except (OSError, http.client.HTTPException) as exc:
                raise self._fail(f"the stream broke off ({exc})") from None

