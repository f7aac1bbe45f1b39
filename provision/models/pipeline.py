"""The body of one HTTP response onto disk: socket reads -> sha256 -> file writes -> periodic flushes.

Imports adapters and core only (and the store's file helpers).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from provision.adapters import http as web
from provision.core.errors import NotGguf
from provision.core.progress import Progress
from provision.models.files import GGUF_MAGIC

READ_SIZE = 1 << 20  # upper bound of one socket read; short reads are written at once
QUEUE_DEPTH = 32  # chunks waiting between two pipeline stages (bounds memory to ~2 x 32 MiB)
FLUSH_EVERY = 64 << 20  # fdatasync while downloading, so writeback overlaps the network and hashing


class WriteFailed(Exception):
    """Writing the partial file failed (as opposed to reading the socket)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def stream_body(resp: web.Response, f: Any, hasher: Any, done: int, progress: Progress, *, check_magic: bool) -> int:
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
                failure.append(WriteFailed(exc))
            except BaseException as exc:
                failure.append(exc)
            unflushed += len(chunk)
            if unflushed >= FLUSH_EVERY:
                unflushed = 0
                flush_wanted.set()

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
        flush_wanted.set()  # wake it now: a timed wait here cost every pull up to its timeout
        flush.join()
    if failure:
        raise failure[0]
    return done
