"""The model store: sha256-verified pulls with resume, a content-addressed cache, name refs.

Layout under ``paths.cache_root()/models`` (PROVISION_CACHE moves the root)::

    blobs/sha256-<hex>      verified GGUF bytes, read-only; a blob is only ever created by rename
    refs/<name>.json        name -> sha256, size, source, pin status
    partial/<key>.partial   a download in progress (key: expected sha256, or sha256 of the URL)
    partial/<key>.json      what the partial belongs to: URL, expected sha256, ETag/Last-Modified
    locks/<key>.lock        filelock: one download per blob, however many pulls ask for it

A pull hashes bytes as they arrive (one pass, no re-read), keeps the partial file between
attempts and runs, resumes with ``Range`` + ``If-Range`` and promotes the file with fsync and
an atomic rename only when its size, sha256 and GGUF magic are right.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import queue
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import filelock

from provision.adapters import http as web
from provision.core import paths
from provision.core import pins as pins_mod
from provision.core.errors import BadModelName, DiskFull, DownloadFailed, ModelHashMismatch, NotGguf, UnknownModel
from provision.core.progress import Progress
from provision.models import synth
from provision.models.refs import ModelSpec, check_name, resolve, url_refusal

# The catalog's default for users (a real model, pinned but READ: its bytes were never
# downloaded by this project) and the built-in model for smoke runs and e2e tests (written
# locally, so the main CI job needs no network).
DEFAULT_MODEL = "qwen2.5-0.5b-instruct-q4_k_m"
SMOKE_MODEL = "tiny-llama"

GGUF_MAGIC = b"GGUF"
READ_SIZE = 1 << 20  # upper bound of one socket read; short reads are written at once
QUEUE_DEPTH = 32  # chunks waiting between two pipeline stages (bounds memory to ~2 x 32 MiB)
HASH_BLOCK = 8 << 20
FLUSH_EVERY = 64 << 20  # fdatasync while downloading, so writeback overlaps the network and hashing
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0
MAX_ATTEMPTS = 5  # consecutive attempts that brought no new byte
BACKOFF_S = 0.5  # doubled after each such attempt, capped at BACKOFF_MAX_S
BACKOFF_MAX_S = 8.0
_DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def _is_name(name: str) -> bool:
    try:
        check_name(name)
    except BadModelName:
        return False
    return True


def catalog_names(pins: pins_mod.Pins | None = None) -> list[str]:
    return sorted((pins or pins_mod.default()).models)


@dataclass(frozen=True)
class Ref:
    name: str
    sha256: str
    size: int
    source: str
    pinned: bool
    pin_status: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PullResult:
    ref: Ref
    path: Path
    fetched_bytes: int  # bytes that came over the network in this call
    reused: bool  # the blob was already in the store


@dataclass(frozen=True)
class VerifyResult:
    name: str
    path: Path
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "ok": self.ok, "detail": self.detail}


class _WriteFailed(Exception):
    """Writing the partial file failed (as opposed to reading the socket)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Retry(Exception):
    """A transient failure: try again (after a pause unless the attempt brought new bytes)."""

    def __init__(self, reason: str, *, progressed: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.progressed = progressed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _hash_file(path: Path, limit: int | None = None) -> tuple[Any, int]:
    """sha256 object and byte count of ``path`` (its first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    done = 0
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while limit is None or done < limit:
            want = HASH_BLOCK if limit is None else min(HASH_BLOCK, limit - done)
            n = f.readinto(view[:want])
            if not n:
                break
            h.update(view[:n])
            done += n
    return h, done


def _has_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC


def _strong_validator(resp: web.Response) -> str | None:
    # If-Range needs a strong validator: a strong ETag, else Last-Modified (RFC 9110 13.1.5).
    etag = resp.header("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return resp.header("Last-Modified")


def _content_range(value: str | None) -> tuple[int, int | None] | None:
    # "bytes START-END/TOTAL" (TOTAL may be "*")
    if not value or not value.startswith("bytes "):
        return None
    try:
        span, total = value[6:].split("/", 1)
        start = int(span.split("-", 1)[0])
        return start, (None if total.strip() == "*" else int(total))
    except ValueError:
        return None


class Store:
    def __init__(
        self, root: Path | None = None, pins: pins_mod.Pins | None = None, *, out: TextIO | None = None
    ) -> None:
        self.root = root or paths.cache_dir("models")
        self.pins = pins or pins_mod.default()
        self.out = out if out is not None else sys.stderr
        for sub in ("blobs", "refs", "partial", "locks"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    # --- layout -------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / f"sha256-{sha256}"

    def _ref_path(self, name: str) -> Path:
        return self.root / "refs" / f"{check_name(name)}.json"

    def _partial(self, key: str) -> tuple[Path, Path]:
        return self.root / "partial" / f"{key}.partial", self.root / "partial" / f"{key}.json"

    @contextlib.contextmanager
    def _locked(self, key: str, what: str) -> Iterator[None]:
        lock = filelock.FileLock(str(self.root / "locks" / f"{key}.lock"))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            self._say(f"{what}: waiting for another pull of the same model to finish")
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # --- refs ---------------------------------------------------------------------------------

    def ref(self, name: str) -> Ref | None:
        path = self._ref_path(name)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise ModelHashMismatch(f"{path}: damaged ref ({exc.msg})", fix=f"provision model rm {name}") from None
        try:
            return Ref(**{k: data[k] for k in Ref.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise ModelHashMismatch(f"{path}: damaged ref (missing {exc})", fix=f"provision model rm {name}") from None

    def refs(self) -> list[Ref]:
        out = []
        for path in sorted((self.root / "refs").glob("*.json")):
            if not _is_name(path.stem):
                continue  # not written by the store
            ref = self.ref(path.stem)
            if ref:
                out.append(ref)
        return out

    def _write_ref(self, spec: ModelSpec, sha256: str, size: int) -> Ref:
        ref = Ref(spec.name, sha256, size, spec.source, spec.pinned, spec.pin_status)
        _write_json_atomic(self._ref_path(spec.name), ref.as_dict())
        return ref

    def path(self, name: str) -> Path:
        ref = self.ref(name)
        if ref is None or not self.blob_path(ref.sha256).exists():
            hint = "synth" if (pin := self.pins.models.get(name)) and pin.synth else "pull"
            raise UnknownModel(f"model {name!r} is not in the store {self.root}", fix=f"provision model {hint} {name}")
        return self.blob_path(ref.sha256)

    # --- pull ---------------------------------------------------------------------------------

    def resolve(self, arg: str, *, sha256: str | None = None, name: str | None = None) -> ModelSpec:
        return resolve(arg, self.pins, sha256=sha256, name=name, hf_endpoint=os.environ.get("HF_ENDPOINT") or None)

    def _reusable(self, spec: ModelSpec) -> Ref | None:
        """The stored ref for ``spec`` when its blob is already here (size checked, not re-hashed:
        blobs are only created by a verified rename and are read-only)."""
        if spec.sha256:
            blob = self.blob_path(spec.sha256)
            size = spec.size
            if size is None and (known := self.ref(spec.name)) and known.sha256 == spec.sha256:
                size = known.size  # the size recorded when this name was first pulled
            if blob.exists() and (size is None or blob.stat().st_size == size):
                return self._write_ref(spec, spec.sha256, blob.stat().st_size)
            return None
        ref = self.ref(spec.name)
        if ref and ref.source == spec.source and self.blob_path(ref.sha256).exists():
            return ref
        return None

    def pull(self, spec: ModelSpec) -> PullResult:
        if spec.synth:
            catalog_name = next(n for n, p in self.pins.models.items() if p.synth == spec.synth)
            return self.synth(catalog_name, as_name=spec.name)
        assert spec.url is not None
        if not spec.pinned:
            self._say(f"{spec.name}: no sha256 pinned for {spec.source}; the store will record the hash it computes")
        key = spec.sha256 or hashlib.sha256(spec.url.encode()).hexdigest()
        reused = self._reusable(spec)
        if reused:
            return PullResult(reused, self.blob_path(reused.sha256), 0, True)
        with self._locked(key, spec.name):
            reused = self._reusable(spec)  # another process may have finished it while we waited
            if reused:
                return PullResult(reused, self.blob_path(reused.sha256), 0, True)
            sha256, size, fetched = self._download(spec, key)
            ref = self._write_ref(spec, sha256, size)
            return PullResult(ref, self.blob_path(sha256), fetched, False)

    def _download(self, spec: ModelSpec, key: str) -> tuple[str, int, int]:
        partial, meta_path = self._partial(key)
        meta = self._load_meta(meta_path, spec)
        if meta is None:
            partial.unlink(missing_ok=True)
            meta = {"url": spec.url, "sha256": spec.sha256, "validator": None}
        fetched = 0
        failures = 0
        last = ""
        while True:
            before = partial.stat().st_size if partial.exists() else 0
            try:
                return self._attempt(spec, partial, meta_path, meta, fetched)
            except _Retry as retry:
                after = partial.stat().st_size if partial.exists() else 0
                fetched += max(after - before, 0)
                failures = 0 if retry.progressed else failures + 1
                last = retry.reason
                if failures >= MAX_ATTEMPTS:
                    raise DownloadFailed(
                        f"{spec.url}: {last} ({MAX_ATTEMPTS} attempts in a row brought no new byte); "
                        f"{after} bytes kept in {partial} for the next pull",
                        fix="check the network or the URL and run the pull again: it resumes",
                    ) from None
                pause = 0.0 if retry.progressed else min(BACKOFF_S * 2 ** (failures - 1), BACKOFF_MAX_S)
                self._say(f"{spec.name}: {last}; " + (f"retrying in {pause:.1f}s" if pause else "resuming"))
                time.sleep(pause)

    @staticmethod
    def _load_meta(meta_path: Path, spec: ModelSpec) -> dict[str, Any] | None:
        try:
            meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        # A partial only continues the same URL with the same expectation.
        return meta if meta.get("url") == spec.url and meta.get("sha256") == spec.sha256 else None

    def _attempt(
        self, spec: ModelSpec, partial: Path, meta_path: Path, meta: dict[str, Any], fetched: int
    ) -> tuple[str, int, int]:
        """One request: resume or restart the partial file, stream the body, then promote it."""
        offset = partial.stat().st_size if partial.exists() else 0
        with self._request(spec, offset, meta) as resp:
            offset, total = self._accept(spec, resp, offset, partial)
            if resp.status == 200 or not meta.get("validator"):
                meta["validator"] = _strong_validator(resp)  # the caller keeps it for the next attempt
            _write_json_atomic(meta_path, meta)
            if offset:
                hasher, hashed = _hash_file(partial, offset)  # hashlib state cannot be saved: re-read
                if hashed != offset:
                    raise _Retry("the partial file shrank while resuming", progressed=False)
            else:
                hasher = hashlib.sha256()
            progress = Progress(spec.name, total, start=offset, stream=self.out)
            try:
                with open(partial, "r+b" if offset else "wb", buffering=0) as f:
                    f.truncate(offset)
                    f.seek(offset)
                    done = self._stream(resp, f, hasher, offset, progress, check_magic=offset == 0)
                    if total is not None and done < total:
                        raise _Retry(f"connection closed after {done} of {total} bytes", progressed=done > offset)
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
            except NotGguf:
                partial.unlink(missing_ok=True)
                meta_path.unlink(missing_ok=True)
                raise
            except (OSError, http.client.HTTPException) as exc:  # from the socket: keep what arrived
                raise _Retry(
                    f"connection lost: {exc or type(exc).__name__}", progressed=partial.stat().st_size > offset
                ) from None
            progress.finish()
        return self._promote(spec, partial, meta_path, hasher.hexdigest(), done, fetched + done - offset)

    @staticmethod
    def _request(spec: ModelSpec, offset: int, meta: dict[str, Any]) -> web.Response:
        assert spec.url is not None
        headers = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            if meta.get("validator"):
                # The server sends the rest only if the file is unchanged, else all of it (200).
                headers["If-Range"] = str(meta["validator"])
        try:
            return web.get(
                spec.url,
                headers=headers,
                connect_timeout=CONNECT_TIMEOUT_S,
                read_timeout=READ_TIMEOUT_S,
                allow=url_refusal,
            )
        except web.HttpError as exc:
            raise DownloadFailed(str(exc)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise _Retry(f"request failed: {exc or type(exc).__name__}", progressed=False) from None

    def _accept(self, spec: ModelSpec, resp: web.Response, offset: int, partial: Path) -> tuple[int, int | None]:
        """Decide from the status where the body starts; return (offset, total size if known)."""
        status = resp.status
        if status == 416 and offset:
            partial.unlink()  # our partial is not a prefix the server knows: start again
            raise _Retry("the server refused the resume range (416); starting from 0", progressed=True)
        if status >= 500 or status in (408, 429):
            raise _Retry(f"HTTP {status} {resp.reason}", progressed=False)
        if status not in (200, 206):
            raise DownloadFailed(f"{spec.url}: HTTP {status} {resp.reason}", fix="check the URL (and --sha256)")
        total: int | None
        if status == 206:
            span = _content_range(resp.header("Content-Range"))
            if span is None or span[0] != offset:
                partial.unlink(missing_ok=True)
                got = resp.header("Content-Range")
                raise _Retry(f"the server answered Range {offset}- with {got!r}; starting from 0", progressed=True)
            total = span[1]
        else:
            if offset:
                self._say(
                    f"{spec.name}: the server sent the whole file (Range ignored or file changed); starting from 0"
                )
            offset = 0
            total = resp.content_length
        if spec.size is not None and total is not None and total != spec.size:
            raise ModelHashMismatch(f"{resp.url}: the server offers {total} bytes, the pin says {spec.size}")
        total = total if total is not None else spec.size
        if total is not None:
            need = total - offset
            free = shutil.disk_usage(partial.parent).free
            if need > free:
                raise DiskFull(
                    f"{spec.name} needs {need} more bytes in {partial.parent}, only {free} are free",
                    fix="free some space or move the cache (PROVISION_CACHE)",
                )
        return offset, total

    @staticmethod
    def _stream(resp: web.Response, f: Any, hasher: Any, done: int, progress: Progress, *, check_magic: bool) -> int:
        """A pipeline of threads: socket reads (here) → hashing → writing → periodic disk flushes.

        recv, hashlib, file writes and fdatasync all drop the GIL, so the stages overlap and a pull
        runs at about the speed of its slowest stage. Chunks are written as soon as they arrive:
        bytes this process received survive its being killed. Flushing every FLUSH_EVERY bytes
        while the download runs leaves little for the final fsync.
        """
        to_hash: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        to_write: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUE_DEPTH)
        failure: list[BaseException] = []
        flush_wanted = threading.Event()
        finished = threading.Event()

        def hash_stage() -> None:
            while (chunk := to_hash.get()) is not None:
                if not failure:  # after an error keep draining so no producer blocks on a full queue
                    try:
                        hasher.update(chunk)
                    except BaseException as exc:
                        failure.append(exc)
                to_write.put(chunk)
            to_write.put(None)

        def write_stage() -> None:
            unflushed = 0
            while (chunk := to_write.get()) is not None:
                if failure:
                    continue
                try:
                    view = memoryview(chunk)
                    while view:  # a raw file may write less than asked (e.g. at a size limit)
                        view = view[f.write(view) :]
                except OSError as exc:  # handed to the reader thread below
                    failure.append(_WriteFailed(exc))
                except BaseException as exc:
                    failure.append(exc)
                unflushed += len(chunk)
                if unflushed >= FLUSH_EVERY:
                    unflushed = 0
                    flush_wanted.set()

        def flush_stage() -> None:
            while not finished.is_set():
                if flush_wanted.wait(0.2):
                    flush_wanted.clear()
                    try:
                        os.fdatasync(f.fileno())
                    except OSError as exc:
                        failure.append(_WriteFailed(exc))
                        return

        stages = [
            threading.Thread(target=t, name=f"model-{t.__name__}", daemon=True) for t in (hash_stage, write_stage)
        ]
        flush = threading.Thread(target=flush_stage, name="model-flush", daemon=True)
        for thread in (*stages, flush):
            thread.start()
        head = b""
        try:
            while not failure:
                chunk = resp.read1(READ_SIZE)
                if not chunk:
                    break
                if check_magic and len(head) < 4:
                    head += chunk[:4]
                    if len(head) >= 4 and head[:4] != GGUF_MAGIC:
                        raise NotGguf(f"{resp.url} does not start with the GGUF magic (got {head[:4]!r})")
                to_hash.put(chunk)
                done += len(chunk)
                progress.update(done)
        finally:
            to_hash.put(None)
            for thread in stages:
                thread.join()
            finished.set()
            flush.join()
        if failure:
            raise failure[0]
        return done

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
                fix="check --sha256 (or the pins file) and the URL; if the server changed the file, re-pin it",
            )
        if not _has_magic(partial):
            discard()
            raise NotGguf(f"{spec.url}: the downloaded file does not start with the GGUF magic; nothing was stored")
        self._install_blob(partial, sha256)
        meta_path.unlink(missing_ok=True)
        return sha256, size, fetched

    def _install_blob(self, tmp: Path, sha256: str) -> Path:
        # Replace rather than keep an existing blob: these bytes were just verified, and a blob of
        # the right name but the wrong size (damaged by hand) is why _reusable() sent us here.
        blob = self.blob_path(sha256)
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
        _fsync_dir(blob.parent)
        return blob

    # --- synth --------------------------------------------------------------------------------

    def _synth_pin(self, name: str) -> pins_mod.ModelPin:
        pin = self.pins.models.get(check_name(name))
        if pin is None or not pin.synth:
            known = sorted(n for n, p in self.pins.models.items() if p.synth)
            raise UnknownModel(f"{name!r} is not a synthetic catalog model (known: {', '.join(known)})")
        return pin

    def synth_to(self, name: str, output: Path) -> tuple[str, int]:
        """Write the synthetic catalog model ``name`` to ``output`` and check it against its pin."""
        pin = self._synth_pin(name)
        assert pin.synth is not None
        synth.check_versions(self.pins)
        write = synth.generator(pin.synth)
        output.unlink(missing_ok=True)
        with contextlib.redirect_stdout(sys.stderr):  # the gguf writer logs; stdout stays for reports
            write(output)
        hasher, size = _hash_file(output)
        sha256 = hasher.hexdigest()
        if (sha256, size) != (pin.sha256, pin.size):
            output.unlink()
            raise ModelHashMismatch(
                f"synth {name}: wrote {size} bytes with sha256 {sha256}, but {self.pins.path} models.{name} pins "
                f"{pin.size} bytes, sha256 {pin.sha256}; nothing was kept",
                fix="the generator or the gguf/numpy versions changed: fix them, or re-pin on purpose",
            )
        return sha256, size

    def synth(self, name: str, *, as_name: str | None = None) -> PullResult:
        """Synthesize catalog model ``name`` into the store (under ``as_name`` when given)."""
        pin = self._synth_pin(name)
        spec = ModelSpec(
            check_name(as_name or name), f"synth:{pin.synth}", None, pin.sha256, pin.size, pin.status, pin.synth
        )
        with self._locked(pin.sha256, spec.name):
            reused = self._reusable(spec)
            if reused:
                return PullResult(reused, self.blob_path(reused.sha256), 0, True)
            tmp, _ = self._partial(f"synth-{name}.{os.getpid()}")
            try:
                sha256, size = self.synth_to(name, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                self._install_blob(tmp, sha256)
            finally:
                tmp.unlink(missing_ok=True)
            ref = self._write_ref(spec, sha256, size)
            return PullResult(ref, self.blob_path(sha256), 0, False)

    # --- verify, remove -----------------------------------------------------------------------

    def verify(self, name: str) -> VerifyResult:
        ref = self.ref(name)
        if ref is None:
            raise UnknownModel(f"model {name!r} is not in the store {self.root}", fix=f"provision model pull {name}")
        blob = self.blob_path(ref.sha256)
        if not blob.exists():
            return VerifyResult(name, blob, False, "blob missing")
        hasher, size = _hash_file(blob)
        if size != ref.size:
            return VerifyResult(name, blob, False, f"{size} bytes, expected {ref.size}")
        if hasher.hexdigest() != ref.sha256:
            return VerifyResult(name, blob, False, f"sha256 {hasher.hexdigest()}, expected {ref.sha256}")
        if not _has_magic(blob):
            return VerifyResult(name, blob, False, "no GGUF magic")
        return VerifyResult(name, blob, True, f"sha256 {ref.sha256} ({size} bytes)")

    def remove(self, name: str) -> Ref:
        ref = self.ref(name)
        if ref is None:
            raise UnknownModel(f"model {name!r} is not in the store {self.root}")
        with self._locked(ref.sha256, name):
            self._ref_path(name).unlink()
            if not any(other.sha256 == ref.sha256 for other in self.refs()):
                self.blob_path(ref.sha256).unlink(missing_ok=True)
        return ref


def ensure(name: str, *, out: TextIO | None = None) -> Path:
    """The verified blob of catalog (or stored) model ``name``: pulled or synthesized when
    missing, re-hashed in any case. For image builds that bake a model in."""
    store = Store(out=out)
    check_name(name)
    if store.ref(name) is None:
        pin = store.pins.models.get(name)
        if pin is None:
            known = ", ".join(catalog_names(store.pins))
            raise UnknownModel(
                f"model {name!r} is neither in the catalog nor in the store (catalog: {known})",
                fix="provision model pull URL --name NAME --sha256 HEX",
            )
        if pin.synth:
            store.synth(name)
        else:
            store.pull(store.resolve(name))
    result = store.verify(name)
    if not result.ok:
        raise ModelHashMismatch(
            f"{name}: stored blob {result.path}: {result.detail}", fix=f"provision model rm {name} and pull it again"
        )
    return result.path
