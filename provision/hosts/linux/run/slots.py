"""GPU VM slots: at most N GPU guests at once on this host, a further one waits.

A slot is an exclusive ``flock`` on ``<cache>/gpu-slots/slot-<i>.lock``; the kernel drops
it when the holder exits, however it exits, so a crashed run never leaks a slot.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from provision.core import settings
from provision.core.errors import GpuSlotTimeout, RunCancelled
from provision.core.paths import cache_dir

ENV_VAR = settings.BY_KEY["gpu_slots"].env
DEFAULT_SLOTS = int(settings.default_of("gpu_slots"))


def slot_count(given: settings.Settings | None = None) -> int:
    """The setting ``gpu_slots`` (checked where it was read: a file, the environment or --set)."""
    return (given or settings.current()).typed.gpu_slots


@dataclass
class Slot:
    index: int
    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def try_acquire(count: int | None = None, directory: Path | None = None) -> Slot | None:
    directory = directory or cache_dir("gpu-slots")
    for i in range(count or slot_count()):
        path = directory / f"slot-{i}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return Slot(i, path, fd)
    return None


def acquire(
    deadline: float,
    count: int | None = None,
    directory: Path | None = None,
    poll_s: float = 0.25,
    cancel: threading.Event | None = None,
) -> Slot:
    """A free slot, waiting until ``deadline`` (time.monotonic()) and then E022; E026 once ``cancel`` is set."""
    n = count or slot_count()
    while True:
        slot = try_acquire(n, directory)
        if slot is not None:
            return slot
        if cancel is not None and cancel.is_set():
            raise RunCancelled("the run was cancelled while it waited for a GPU VM slot")
        if time.monotonic() >= deadline:
            raise GpuSlotTimeout(
                f"all {n} GPU VM slots stayed busy until the deadline",
                fix=f"wait for the running GPU guests to finish, raise --timeout, or set {ENV_VAR}",
            )
        time.sleep(poll_s)
