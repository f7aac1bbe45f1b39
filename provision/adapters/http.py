"""The one HTTP client of provision (`requests`): GET with headers, checked redirects, timeouts.

The model store needs short reads (``read1``, or ``readinto1`` into its own buffers: whatever
arrived is written at once, so a killed pull keeps it), separate connect and read timeouts, and
the status of every response (206 vs 200 decides resume vs restart) without an exception for
4xx/5xx. Redirects are followed here, one hop at a time, so that every target passes the
caller's URL policy and credentials never travel to another origin. Retries and resume are the
caller's business: this adapter makes one request (plus redirects) and hands back the response.
Errors come out as the standard library's kinds (TimeoutError, ConnectionError/OSError,
http.client.HTTPException) so callers need not know which client library is underneath.
"""

from __future__ import annotations

import http.client
import select
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

if TYPE_CHECKING:
    import requests

# REQUESTS_LAZILY: requests and urllib3 are imported inside the functions that use them. With its
# dependencies (urllib3, charset_normalizer, idna, http.cookiejar) requests takes about 0.08 s to
# import on the 2-core VM, a third of a 1 MiB pull's whole run, and commands that load the model
# store without making a request (`model path`, `model list`, a run whose model is stored) paid it
# every time. Imported by name in each function, so mypy still checks every attribute.

USER_AGENT = "krun-gpu-provision/0.1"
_REDIRECTS = (301, 302, 303, 307, 308)
SMALL_LIMIT = 8 << 20  # manifests, token answers and file listings are far smaller
_SECRET_HEADERS = ("authorization", "cookie")


def new_session() -> requests.Session:
    """A new requests session (connections reused across one caller's requests)."""
    import requests  # at the first request, not with this module: see REQUESTS_LAZILY

    return requests.Session()


class HttpError(Exception):
    """A request could not be made or answered (not a status: those come back in Response)."""


def _translate(exc: BaseException) -> BaseException:
    """A requests/urllib3 exception as the standard library's kind (the callers' contract)."""
    import requests
    import urllib3.exceptions

    if isinstance(exc, requests.exceptions.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
        return TimeoutError(str(exc) or "timed out")
    if isinstance(exc, requests.exceptions.InvalidURL | requests.exceptions.InvalidHeader | ValueError):
        return HttpError(str(exc))
    # Refused, reset, a garbled status line, a hang-up before the answer: the connection failed.
    return ConnectionError(str(exc) or type(exc).__name__)


def _clean_close(exc: BaseException) -> bool:
    import urllib3.exceptions

    incomplete = (urllib3.exceptions.IncompleteRead, http.client.IncompleteRead)
    return isinstance(exc, incomplete) or any(isinstance(a, incomplete) for a in exc.args)


@dataclass
class Response:
    url: str  # after redirects
    status: int
    reason: str
    headers: Mapping[str, str]
    raw: Any  # urllib3's HTTPResponse, read unbuffered with read1
    inner: requests.Response

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def content_length(self) -> int | None:
        value = self.header("Content-Length")
        return int(value) if value and value.isdigit() else None

    def read1(self, n: int) -> bytes:
        """At most ``n`` bytes, from at most one socket read; b"" at the end (even a premature one)."""
        import urllib3.exceptions

        try:
            data: bytes = self.raw.read1(n)
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError) as exc:
            raise TimeoutError(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            if _clean_close(exc):
                return b""  # closed before Content-Length: the caller counts the bytes and says so
            raise ConnectionError(str(exc) or type(exc).__name__) from None
        return data

    def _plain_body(self) -> http.client.HTTPResponse | None:
        """The standard library's response underneath, where its body is plain bytes of a known length.

        requests reads undecoded here (``decode_content`` is off), so a body that is neither chunked
        nor of unknown length is the bytes on the socket: ``readinto1`` reads them straight into the
        caller's buffer instead of into a new bytes object per read.
        """
        inner = getattr(self.raw, "_fp", None)  # urllib3 keeps http.client's response here
        if isinstance(inner, http.client.HTTPResponse) and not inner.chunked and inner.length is not None:
            return inner if inner.fp is not None else None
        return None

    def readinto1(self, view: memoryview) -> int:
        """Like ``read1`` into ``view``: what is already buffered, else at most one socket read; 0 at the end."""
        body = self._plain_body()
        if body is None or body.fp is None:
            data = self.read1(len(view))
            view[: len(data)] = data
            return len(data)
        want = min(len(view), body.length or 0)
        if not want:
            return 0
        try:
            n = body.fp.readinto1(view[:want])
        except TimeoutError as exc:
            raise TimeoutError(str(exc) or "timed out") from None
        body.length = (body.length or 0) - n  # kept as http.client would, so its own reads stay right
        return n

    def waiting(self) -> bool:
        """True when more body bytes sit on the socket now (a read would not block); False if unsure."""
        body = self._plain_body()
        if body is None or body.fp is None or not body.length:
            return False
        try:
            poller = select.poll()
            poller.register(body.fp.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        except (OSError, ValueError, AttributeError):  # closed, or no poll on this platform's socket
            return False

    def read_all(self, limit: int = SMALL_LIMIT) -> bytes:
        """The whole body (a small one: more than ``limit`` bytes is an HttpError)."""
        parts: list[bytes] = []
        got = 0
        while chunk := self.read1(1 << 16):
            got += len(chunk)
            if got > limit:
                raise HttpError(f"{self.url}: the answer is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def lines(self) -> Iterator[bytes]:
        """The body line by line as it arrives (each with its b"\\n"), for streamed events."""
        pending = b""
        while chunk := self.read1(1 << 16):
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                yield line + b"\n"
        if pending:
            yield pending

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def get(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    connect_timeout: float = 15.0,
    read_timeout: float = 60.0,
    max_redirects: int = 10,
    allow: Callable[[str], str | None] = lambda _url: None,
    session: requests.Session | None = None,
) -> Response:
    """GET ``url`` following redirects; ``allow(url)`` returns a refusal reason for a redirect target.

    Raises OSError (connection refused/reset: ConnectionError; timeouts: TimeoutError),
    http.client.HTTPException (garbled responses) and HttpError (too many redirects, a refused
    redirect target, a URL no request can be made to). Authorization and Cookie headers are
    dropped on a redirect to another origin (registries send blobs to a CDN).
    """
    import requests
    import urllib3.exceptions

    sent = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})}
    http_session = session or new_session()
    for _ in range(max_redirects + 1):
        try:
            inner = http_session.get(
                url, headers=sent, stream=True, allow_redirects=False, timeout=(connect_timeout, read_timeout)
            )
        except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, ValueError) as exc:
            raise _translate(exc) from None
        if inner.status_code in _REDIRECTS and inner.headers.get("Location"):
            location = inner.headers["Location"]
            inner.close()
            try:
                target = urljoin(url, location)
                _origin(target)  # a malformed port or host raises here
            except ValueError as exc:  # e.g. an unclosed IPv6 bracket
                raise HttpError(f"{url} redirects to {location!r}, which is malformed: {exc}") from None
            why = allow(target)
            if why:
                raise HttpError(f"{url} redirects to {target}, which is refused: {why}")
            if _origin(target) != _origin(url):
                sent = {k: v for k, v in sent.items() if k.lower() not in _SECRET_HEADERS}
            url = target
            continue
        return Response(url, inner.status_code, inner.reason or "", inner.headers, inner.raw, inner)
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
    import requests
    import urllib3.exceptions

    sent = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **(headers or {})}
    try:
        inner = new_session().post(
            url, data=body, headers=sent, stream=True, allow_redirects=False, timeout=(connect_timeout, read_timeout)
        )
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, ValueError) as exc:
        raise _translate(exc) from None
    return Response(url, inner.status_code, inner.reason or "", inner.headers, inner.raw, inner)
