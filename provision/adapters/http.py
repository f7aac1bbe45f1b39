"""The one HTTP client of provision (stdlib http.client): GET with headers, redirects, timeouts.

Why http.client and not urllib.request: the model store needs short reads (``read1``) so
whatever arrived is written at once (a killed pull keeps it), separate connect and read
timeouts, and the status of every response (206 vs 200 decides resume vs restart) without
urllib raising on 4xx/5xx. Retries and resume are the caller's business: this adapter makes
one request (plus redirects) and hands back the response.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

USER_AGENT = "krun-gpu-provision/0.1"
_REDIRECTS = (301, 302, 303, 307, 308)


class HttpError(Exception):
    """A request could not be made or answered (not a status: those come back in Response)."""


@dataclass
class Response:
    url: str  # after redirects
    status: int
    reason: str
    headers: http.client.HTTPMessage
    raw: http.client.HTTPResponse
    conn: http.client.HTTPConnection

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def content_length(self) -> int | None:
        value = self.header("Content-Length")
        return int(value) if value and value.isdigit() else None

    def read1(self, n: int) -> bytes:
        """At most ``n`` bytes, from at most one socket read; b"" at the end (even a premature one)."""
        return self.raw.read1(n)

    def close(self) -> None:
        self.raw.close()
        self.conn.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connection(url: str, connect_timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        port = parts.port or 443
        proxy = urllib.request.getproxies().get("https")
        if proxy and not urllib.request.proxy_bypass(host):
            p = urlsplit(proxy if "://" in proxy else "http://" + proxy)
            conn = http.client.HTTPSConnection(
                p.hostname or "", p.port or 3128, timeout=connect_timeout, context=ssl.create_default_context()
            )
            conn.set_tunnel(host, port)
        else:
            conn = http.client.HTTPSConnection(
                host, port, timeout=connect_timeout, context=ssl.create_default_context()
            )
    else:
        conn = http.client.HTTPConnection(host, parts.port or 80, timeout=connect_timeout)
    return conn, path


def get(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 15.0,
    read_timeout: float = 60.0,
    max_redirects: int = 10,
    allow: Callable[[str], str | None] = lambda _url: None,
) -> Response:
    """GET ``url`` following redirects; ``allow(url)`` returns a refusal reason for a redirect target.

    Raises OSError (connection refused/reset, timeouts), http.client.HTTPException (garbled
    responses) and HttpError (too many redirects, a refused redirect target).
    """
    for _ in range(max_redirects + 1):
        try:
            conn, path = _connection(url, connect_timeout)
        except ValueError as exc:  # a port out of range, a malformed host: no request can be made
            raise HttpError(f"{url}: {exc}") from None
        try:
            conn.connect()
            if conn.sock is not None:
                # The connect timeout is spent; from here on each read waits at most read_timeout.
                conn.sock.settimeout(read_timeout)
            conn.request(
                "GET", path, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})}
            )
            raw = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if raw.status in _REDIRECTS and raw.getheader("Location"):
            location = raw.getheader("Location", "")
            raw.close()
            conn.close()
            try:
                target = urljoin(url, location)
            except ValueError as exc:  # e.g. an unclosed IPv6 bracket
                raise HttpError(f"{url} redirects to {location!r}, which is malformed: {exc}") from None
            why = allow(target)
            if why:
                raise HttpError(f"{url} redirects to {target}, which is refused: {why}")
            url = target
            continue
        return Response(url, raw.status, raw.reason, raw.headers, raw, conn)
    raise HttpError(f"more than {max_redirects} redirects starting at {url}")


def post(
    url: str,
    body: bytes,
    *,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 15.0,
    read_timeout: float = 60.0,
) -> Response:
    """POST ``body`` to ``url`` (no redirects: a POST is not replayed elsewhere); the response streams.

    Raises what ``get`` raises; the caller reads the body (``read1``, or line by line from ``raw``).
    """
    try:
        conn, path = _connection(url, connect_timeout)
    except ValueError as exc:
        raise HttpError(f"{url}: {exc}") from None
    try:
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(read_timeout)
        conn.request("POST", path, body=body, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity",
                                                       "Content-Length": str(len(body)), **(headers or {})})
        raw = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    return Response(url, raw.status, raw.reason, raw.headers, raw, conn)
