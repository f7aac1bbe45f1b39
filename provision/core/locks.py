"""One holder at a time: an exclusive advisory lock (flock) on a lock file, for a with-block.

The lock belongs to the open file, so the kernel drops it when its holder exits or is killed:
nothing stale is left behind to clean up. The lock file itself stays (removing it would let a
second holder lock a new file while the first still holds the old one).

Imports nothing from provision.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path | str, *, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the lock on ``path`` (made if missing) until the block ends.

    ``waiting`` is called once, before blocking, when another process or thread holds it, so
    the caller can say why it pauses. Two opens of one path are two locks, so a thread that
    already holds ``path`` and asks again waits for itself: callers do not nest one lock.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting is not None:
                waiting()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
