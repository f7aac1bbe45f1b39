"""The body of one HTTP response onto disk: socket reads -> sha256 -> file writes -> periodic flushes.

Imports adapters and core only (and the store's file helpers).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.adapters import http as web
from provision.core.errors import NotGguf
from provision.core.progress import Progress
from provision.models.files import GGUF_MAGIC

BUFFER_SIZE = 4 << 20  # one buffer: filled from the socket, hashed, written, reused
# At most this many in flight (16 MiB), made as the stream needs them. Few on purpose: the reader
# runs ahead of hashing, and bytes that wait behind 64 MiB of others have left the caches by the time
# sha256 reads them. Measured here, alternating in one process, median stream of a GiB: 16 buffers
# 0.96 s, 8 0.93 s, 4 0.67 s (hashing hot data alone: 0.55 s); 2 MiB x 8 0.75 s, 8 MiB x 2 0.85 s.
BUFFERS = 4
ALIGN = 4096  # O_DIRECT wants file offsets, lengths and memory on the device's block size; 4 KiB covers 512 too
FLUSH_EVERY = 64 << 20  # page-cache bytes between fdatasyncs, so writeback overlaps the network and hashing
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux only; elsewhere every write goes through the page cache


class WriteFailed(Exception):
    """Writing the partial file failed (as opposed to reading the socket)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class FileWriter:
    """Writes spans of the body at their offsets: the block-aligned middle with O_DIRECT, the rest buffered.

    Why O_DIRECT: the bytes go from our buffer to the disk without a copy into the page cache. On
    the 2-core VM that copy and its page allocation cost 0.3–3 s of system time per GiB, varying
    run to run (writing a GiB buffered took 0.7–4 s, with O_DIRECT 0.87–0.94 s), and that time is
    taken from the core that hashing does not use. Where the file system refuses O_DIRECT (EINVAL)
    every write goes through the page cache, as it does on macOS. The caller's fsync makes both
    kinds durable.
    """

    fd: int  # the caller's descriptor, written through the page cache
    direct_fd: int | None  # the same file opened with O_DIRECT, or None
    direct_bytes: int = 0
    cached_bytes: int = 0
    _unflushed: int = field(default=0, repr=False)

    @classmethod
    def open(cls, fd: int, path: Path) -> FileWriter:
        direct: int | None = None
        if _O_DIRECT:
            try:
                direct = os.open(path, os.O_WRONLY | os.O_CLOEXEC | _O_DIRECT)
            except OSError:  # e.g. EINVAL on a file system without direct I/O: buffered it is
                direct = None
        return cls(fd, direct)

    def close(self) -> None:
        if self.direct_fd is not None:
            os.close(self.direct_fd)
            self.direct_fd = None

    def write(self, view: memoryview, offset: int) -> bool:
        """Write ``view`` at ``offset``; True when FLUSH_EVERY page-cache bytes have gathered since the last flush.

        ``view`` lies in page-aligned memory at the same offset modulo ALIGN as ``offset`` in the
        file, so each span aligned in the file is aligned in memory too.
        """
        head = min(len(view), -offset % ALIGN)
        middle = (len(view) - head) // ALIGN * ALIGN if self.direct_fd is not None else 0
        self._cached(view[:head], offset)
        done = self._direct(view[head : head + middle], offset + head) if middle else 0
        self._cached(view[head + done :], offset + head + done)
        if self._unflushed >= FLUSH_EVERY:
            self._unflushed = 0
            return True
        return False

    def _direct(self, view: memoryview, offset: int) -> int:
        """Bytes written with O_DIRECT (all of ``view``, or fewer: the caller writes the rest buffered)."""
        done = 0
        assert self.direct_fd is not None
        try:
            while done < len(view):
                n = os.pwrite(self.direct_fd, view[done:], offset + done)
                self.direct_bytes += n
                done += n
                if n % ALIGN:  # a short write (a size limit, a full disk): the buffered write says why
                    break
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.close()  # refused here after all: the rest goes through the page cache
        return done

    def _cached(self, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):  # a raw write may write less than asked (e.g. at a size limit)
            done += os.pwrite(self.fd, view[done:], offset + done)
        self.cached_bytes += done
        self._unflushed += done


class _Buffers:
    """Page-aligned buffers (anonymous maps), made up to BUFFERS as the stream needs them, then reused."""

    def __init__(self) -> None:
        self._free: queue.Queue[memoryview] = queue.Queue()
        self._made = 0

    def take(self) -> memoryview:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            if self._made < BUFFERS:
                self._made += 1
                return memoryview(mmap.mmap(-1, BUFFER_SIZE))
            return self._free.get()

    def give(self, buf: memoryview) -> None:
        self._free.put(buf)


_Span = tuple[memoryview, int, int, int]  # buffer, first and end index in it, file offset of the first


def stream_body(
    resp: web.Response, f: Any, path: Path, hasher: Any, done: int, progress: Progress, *, check_magic: bool
) -> int:
    """A pipeline of threads: socket reads (here) → hashing → writing → periodic disk flushes.

    Each buffer is filled straight from the socket while bytes keep arriving, and handed on as
    soon as none are waiting, so a pause in the stream leaves everything received on disk (a
    killed pull keeps it). recv, hashlib, pwrite and fdatasync all drop the GIL, so the stages
    overlap and a pull runs at about the speed of its slowest stage, hashing. Returns the offset
    after the last byte written.
    """
    writer = FileWriter.open(f.fileno(), path)
    buffers = _Buffers()
    to_hash: queue.Queue[_Span | None] = queue.Queue()
    to_write: queue.Queue[_Span | None] = queue.Queue()
    failure: list[BaseException] = []
    flush_wanted = threading.Event()
    finished = threading.Event()

    def hash_stage() -> None:
        while (span := to_hash.get()) is not None:
            if not failure:  # after an error keep passing buffers on, so none is lost to the reader
                try:
                    hasher.update(span[0][span[1] : span[2]])
                except BaseException as exc:
                    failure.append(exc)
            to_write.put(span)
        to_write.put(None)

    def write_stage() -> None:
        while (span := to_write.get()) is not None:
            buf, first, end, offset = span
            if not failure:
                try:
                    if writer.write(buf[first:end], offset):
                        flush_wanted.set()
                except OSError as exc:  # handed to the reader thread below
                    failure.append(WriteFailed(exc))
                except BaseException as exc:
                    failure.append(exc)
            buffers.give(buf)

    def flush_stage() -> None:
        while True:
            flush_wanted.wait()
            flush_wanted.clear()
            if finished.is_set():  # woken to end: the caller's final fsync follows
                return
            try:
                os.fdatasync(f.fileno())
            except OSError as exc:
                failure.append(WriteFailed(exc))
                return

    stages = [
        threading.Thread(target=t, name=f"model-{t.__name__}", daemon=True) for t in (hash_stage, write_stage)
    ]
    flush = threading.Thread(target=flush_stage, name="model-flush", daemon=True)
    for thread in (*stages, flush):
        thread.start()
    head = b""
    ended = False
    try:
        while not ended and not failure:
            buf = buffers.take()
            first = end = done % ALIGN  # the buffer's offset mirrors the file's, for O_DIRECT
            try:
                while end < len(buf):
                    n = resp.readinto1(buf[end:])
                    if not n:
                        ended = True
                        break
                    end += n
                    if not resp.waiting():  # nothing more has arrived: write what is here now
                        break
            finally:  # bytes read before an error are written too: the resume starts after them
                if end > first and check_magic and len(head) < 4:
                    head += bytes(buf[first : min(end, first + 4 - len(head))])
                    if len(head) >= 4 and head[:4] != GGUF_MAGIC:
                        buffers.give(buf)
                        raise NotGguf(f"{resp.url} does not start with the GGUF magic (got {head[:4]!r})")
                if end > first:
                    to_hash.put((buf, first, end, done))
                    done += end - first
                    progress.update(done)
                else:
                    buffers.give(buf)
    finally:
        to_hash.put(None)
        for thread in stages:
            thread.join()
        finished.set()
        flush_wanted.set()  # wake it now: a timed wait here cost every pull up to its timeout
        flush.join()
        writer.close()
    if failure:
        raise failure[0]
    return done
