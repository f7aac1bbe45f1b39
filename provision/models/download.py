"""One pull over HTTP: resume with Range + If-Range, stream through a hashing pipeline, promote.

The store (provision/models/store.py) decides whether a pull is needed and holds the lock;
``Downloader.download`` makes the attempts, each one request, until the file is whole or the
attempt budget is spent. Imports adapters and core only (and the store's file helpers).
"""

from __future__ import annotations

import hashlib
import http.client
import json
import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Protocol, TextIO

from provision.adapters import http as web
from provision.core import settings
from provision.core.errors import DiskFull, DownloadFailed, InvalidValue, ModelHashMismatch, NotGguf
from provision.core.progress import Progress
from provision.models.files import DISK_ERRNOS as _DISK_ERRNOS
from provision.models.files import has_magic as _has_magic
from provision.models.files import hash_file as _hash_file
from provision.models.files import write_json_atomic as _write_json_atomic
from provision.models.pipeline import WriteFailed as _WriteFailed
from provision.models.pipeline import stream_body
from provision.models.refs import ModelSpec, url_refusal


class Store(Protocol):
    """What a download needs of the store (provision/models/store.py), which calls it."""

    out: TextIO

    def _say(self, text: str) -> None: ...

    def _partial(self, key: str) -> tuple[Path, Path]: ...

    def _install_blob(self, tmp: Path, sha256: str) -> Path: ...

CONNECT_TIMEOUT_S = 15.0
STALL_S = float(settings.default_of("stall_s"))  # no byte for this long: stalled (setting stall_s, --stall-timeout)
MAX_STALL_S = settings.MAX_SECONDS
MAX_ATTEMPTS = 5  # consecutive attempts that brought no new byte
MAX_TOTAL_ATTEMPTS = 40  # attempts in all, however each ended
BACKOFF_S = 0.5  # doubled after each such attempt, capped at BACKOFF_MAX_S
BACKOFF_MAX_S = 8.0
_CONTENT_RANGE = re.compile(r"^bytes (?P<start>\d{1,18})-(?P<end>\d{1,18})/(?P<total>\d{1,18}|\*)$")


class _Retry(Exception):
    """A transient failure: try again (after a pause unless the attempt brought new bytes)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _strong_validator(resp: web.Response) -> str | None:
    # If-Range needs a strong validator: a strong ETag, else Last-Modified (RFC 9110 13.1.5).
    etag = resp.header("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return resp.header("Last-Modified")


def _content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """(start, end, total) from "bytes START-END/TOTAL" (TOTAL may be "*"); None when malformed."""
    m = _CONTENT_RANGE.match(value or "")
    if not m:
        return None
    start, end = int(m["start"]), int(m["end"])
    total = None if m["total"] == "*" else int(m["total"])
    if end < start or (total is not None and end >= total):
        return None
    return start, end, total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _summarize(history: list[str]) -> str:
    """Distinct reasons, most recent last, with how often each happened."""
    counts: dict[str, int] = {}
    for reason in history:
        counts[reason] = counts.pop(reason, 0) + 1  # re-inserted: the order is by last occurrence
    return "; ".join(f"{r} (x{n})" if n > 1 else r for r, n in counts.items())


def check_stall(value: float, what: str) -> float:
    if not math.isfinite(value) or value <= 0 or value > MAX_STALL_S:
        raise InvalidValue(
            f"{what} {value!r}: must be a number of seconds above 0 and at most {MAX_STALL_S:g}",
            fix=f"e.g. {what} {STALL_S:g}",
        )
    return value


def stall_seconds(given: settings.Settings | None = None) -> float:
    """How long a pull waits for the next byte before it counts the attempt as stalled (the
    setting stall_s, checked where it was read)."""
    return (given or settings.current()).typed.stall_s


# What to do when the bytes are not the expected sha256 depends on who named that sha256.
_MISMATCH_FIX = {
    "": "check --sha256 (or the pins file) and the URL; if the server changed the file, re-pin it",
    "DIGEST": "the registry served other bytes than its manifest's digest: pull again later; if it persists, the "
    "registry's copy is damaged (tell its owner)",
    "LISTED": "the hub served other bytes than its file listing names: pull again later; if it persists, the file "
    "changed under its listing (tell the repository's owner)",
}
_MISMATCH_FIX["LAYER"] = _MISMATCH_FIX["DIGEST"]


class Downloader:
    """The attempts of one pull for ``store`` (its partial files, messages and blob install)."""

    def __init__(self, store: Store, *, keep_at: Path | None = None) -> None:
        self.store = store
        self.out = store.out
        # An archive (an image layer) rather than a GGUF: no magic to check, and once its sha256 is
        # right it is moved to ``keep_at`` for the caller to read, not installed as a blob.
        self.keep_at = keep_at

    def _say(self, text: str) -> None:
        self.store._say(text)

    def _partial(self, key: str) -> tuple[Path, Path]:
        return self.store._partial(key)

    def _install_blob(self, tmp: Path, sha256: str) -> Path:
        return self.store._install_blob(tmp, sha256)

    def download(self, spec: ModelSpec, key: str, stall: float) -> tuple[str, int, int]:
        """Attempts until the file is whole, or the budget is spent.

        An attempt counts as progress only when the partial file grows past the most it ever
        held in this pull (its high-water mark): a server that restarts from zero (ignores
        Range, or answers it with a 206 from byte 0) and dies half-way makes no progress, so
        it cannot keep a pull going forever. MAX_ATTEMPTS failures in a row, or
        MAX_TOTAL_ATTEMPTS attempts in all, end the pull with E012 naming what the server did.
        """
        partial, meta_path = self._partial(key)
        meta = self._load_meta(meta_path, spec)
        if meta is None:
            partial.unlink(missing_ok=True)
            meta = {"url": spec.url, "sha256": spec.sha256, "validator": None}
        high_water = partial.stat().st_size if partial.exists() else 0
        received = [0]  # body bytes that came over the network in this call
        failures = 0
        history: list[str] = []
        for attempt in range(1, MAX_TOTAL_ATTEMPTS + 1):
            try:
                return self._attempt(spec, partial, meta_path, meta, received, stall)
            except _Retry as retry:
                after = partial.stat().st_size if partial.exists() else 0
                progressed = after > high_water
                high_water = max(high_water, after)
                failures = 0 if progressed else failures + 1
                history.append(retry.reason)
                if failures >= MAX_ATTEMPTS or attempt == MAX_TOTAL_ATTEMPTS:
                    why = (
                        f"{MAX_ATTEMPTS} attempts in a row brought no new byte"
                        if failures >= MAX_ATTEMPTS
                        else f"{MAX_TOTAL_ATTEMPTS} attempts in all"
                    )
                    raise DownloadFailed(
                        f"{spec.url}: gave up after {attempt} attempts ({why}); what the server did: "
                        f"{_summarize(history)}"
                        + (f"; {after} bytes kept in {partial} for the next pull" if after else ""),
                        fix="check the URL and the server (or the network), then run the pull again: it resumes",
                    ) from None
                pause = 0.0 if progressed else min(BACKOFF_S * 2 ** (failures - 1), BACKOFF_MAX_S)
                self._say(
                    f"{spec.name}: attempt {attempt}: {retry.reason}; "
                    + (f"retrying in {pause:.1f}s" if pause else "resuming")
                )
                time.sleep(pause)
        raise AssertionError("unreachable: the loop returns or raises")

    @staticmethod
    def _load_meta(meta_path: Path, spec: ModelSpec) -> dict[str, Any] | None:
        try:
            meta: Any = json.loads(meta_path.read_bytes().decode("utf-8"))
        except (OSError, ValueError):  # missing, not UTF-8 or not JSON: start afresh
            return None
        # A partial only continues the same URL with the same expectation.
        if not isinstance(meta, dict) or meta.get("url") != spec.url or meta.get("sha256") != spec.sha256:
            return None
        return meta

    def _attempt(
        self, spec: ModelSpec, partial: Path, meta_path: Path, meta: dict[str, Any], received: list[int], stall: float
    ) -> tuple[str, int, int]:
        """One request: resume or restart the partial file, stream the body, then promote it."""
        offset = partial.stat().st_size if partial.exists() else 0
        with self._request(spec, offset, meta, stall) as resp:
            start, total = self._accept(spec, resp, offset, partial)
            if resp.status == 200 or not meta.get("validator"):
                meta["validator"] = _strong_validator(resp)  # the caller keeps it for the next attempt
            _write_json_atomic(meta_path, meta)
            if start:
                hasher, hashed = _hash_file(partial, start)  # hashlib state cannot be saved: re-read
                if hashed != start:
                    raise _Retry("the partial file shrank while resuming")
            else:
                hasher = hashlib.sha256()
            progress = Progress(spec.name, total, start=start, stream=self.out)
            done = start
            try:
                with open(partial, "r+b" if start else "wb", buffering=0) as f:
                    f.truncate(start)
                    f.seek(start)
                    done = stream_body(resp, f, partial, hasher, start, progress,
                                       check_magic=start == 0 and self.keep_at is None)  # fmt: skip
                    if total is not None and done < total:
                        raise _Retry(f"connection closed after byte {done} of {total}")
                    try:
                        os.fsync(f.fileno())
                    except OSError as exc:
                        raise _WriteFailed(exc) from None
            except _WriteFailed as failed:
                partial.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                err = failed.error
                if err.errno in _DISK_ERRNOS:
                    raise DiskFull(
                        f"writing {partial}: {os.strerror(err.errno or 0)} (disk full or file size limit); "
                        "nothing was stored",
                        fix="free space, raise the file size limit (ulimit -f) or move the cache (PROVISION_CACHE)",
                    ) from None
                raise DownloadFailed(f"writing {partial}: {err}; nothing was stored") from None
            except (NotGguf, ModelHashMismatch):
                partial.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                raise
            except TimeoutError:  # from the socket: keep what arrived
                raise _Retry(f"stalled: no byte for {stall:g}s after byte {_size(partial)}") from None
            except (OSError, http.client.HTTPException) as exc:
                raise _Retry(f"connection lost after byte {_size(partial)}: {exc or type(exc).__name__}") from None
            finally:
                received[0] += max(_size(partial) - start, 0)
            progress.finish()
        return self._promote(spec, partial, meta_path, hasher.hexdigest(), done, received[0])

    @staticmethod
    def _request(spec: ModelSpec, offset: int, meta: dict[str, Any], stall: float) -> web.Response:
        assert spec.url is not None
        headers = dict(spec.headers)
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if meta.get("validator"):
                # The server sends the rest only if the file is unchanged, else all of it (200).
                headers["If-Range"] = str(meta["validator"])
        try:
            return web.get(
                spec.url,
                headers=headers,
                connect_timeout=min(CONNECT_TIMEOUT_S, max(stall, 1.0)),
                read_timeout=stall,
                allow=url_refusal,
            )
        except web.HttpError as exc:
            raise DownloadFailed(str(exc)) from None
        except TimeoutError:
            raise _Retry(f"no answer within {stall:g}s (connected, but the server sent nothing)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Retry(f"request failed: {exc or type(exc).__name__}") from None

    def _accept(self, spec: ModelSpec, resp: web.Response, offset: int, partial: Path) -> tuple[int, int | None]:
        """Decide from the status where the body starts; return (start, total size if known).

        ``start`` is ``offset`` for a proper resume, 0 for a restart (a 200, or a 206 from byte 0).
        A Content-Range that is neither is refused without touching the partial file.
        """
        status = resp.status
        if status == 416 and offset:
            partial.unlink()  # our partial is not a prefix the server knows: start again
            raise _Retry(f"the server refused the resume range bytes={offset}- (416); restarting from 0")
        if status >= 500 or status in (408, 429):
            raise _Retry(f"HTTP {status} {resp.reason}")
        if status not in (200, 206):
            raise DownloadFailed(f"{spec.url}: HTTP {status} {resp.reason}", fix="check the URL (and --sha256)")
        total: int | None
        if status == 206:
            got = resp.header("Content-Range")
            span = _content_range(got)
            length = resp.content_length
            if span is None or span[0] not in (offset, 0) or (length is not None and length != span[1] - span[0] + 1):
                raise _Retry(f"wrong Content-Range {got!r} for Range bytes={offset}- (Content-Length {length})")
            start, _end, total = span
            if start != offset:
                self._say(f"{spec.name}: the server answered Range bytes={offset}- from byte 0; starting from 0")
        else:
            start = 0
            total = resp.content_length
            if offset:
                self._say(f"{spec.name}: the server sent all of it (Range ignored or file changed); starting from 0")
        if spec.size is not None and total is not None and total != spec.size:
            raise ModelHashMismatch(
                f"{resp.url}: the server offers {total} bytes, the pin says {spec.size}; nothing was stored"
            )
        total = total if total is not None else spec.size
        if total is not None:
            need = total - start
            free = shutil.disk_usage(partial.parent).free
            if need > free:
                raise DiskFull(
                    f"{spec.name} needs {need} more bytes in {partial.parent}, only {free} are free",
                    fix="free some space or move the cache (PROVISION_CACHE)",
                )
        return start, total

    def _promote(
        self, spec: ModelSpec, partial: Path, meta_path: Path, sha256: str, size: int, fetched: int
    ) -> tuple[str, int, int]:
        def discard() -> None:
            partial.unlink(missing_ok=True)
            meta_path.unlink(missing_ok=True)

        if spec.size is not None and size != spec.size:
            discard()
            raise ModelHashMismatch(f"{spec.url}: got {size} bytes, expected {spec.size}; nothing was stored")
        if spec.sha256 is not None and sha256 != spec.sha256:
            discard()
            raise ModelHashMismatch(
                f"{spec.url}: sha256 of the {size} bytes received is {sha256}, expected {spec.sha256}; "
                "nothing was stored (partial file removed)",
                fix=_MISMATCH_FIX.get(spec.pin_status or "", _MISMATCH_FIX[""]),
            )
        if self.keep_at is not None:
            os.replace(partial, self.keep_at)
            meta_path.unlink(missing_ok=True)
            return sha256, size, fetched
        if not _has_magic(partial):
            discard()
            raise NotGguf(f"{spec.url}: the downloaded file does not start with the GGUF magic; nothing was stored")
        self._install_blob(partial, sha256)
        meta_path.unlink(missing_ok=True)
        return sha256, size, fetched
