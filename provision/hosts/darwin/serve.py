"""`provision serve` on macOS: the guest is one host process, `podman run` with the port published.

Stopping it is SIGTERM, which podman passes to the container (``--rm`` then removes it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import BinaryIO

from provision.adapters import procs
from provision.core.errors import ProvisionError, VmFailed


class ProcessGuest:
    """A guest that is one host process (`podman run` on macOS): stopping it is SIGTERM, which
    podman passes to the container (--rm then removes it)."""

    def __init__(self, argv: list[str], *, out: BinaryIO, err: BinaryIO) -> None:
        self.argv, self.out, self.err = argv, out, err
        self.proc: procs.Popen[bytes] | None = None
        self.run_dir: Path | None = None
        self._booted: float | None = None

    def start(self) -> None:
        self.run_dir = procs.job_dir()
        self.proc = procs.spawn(
            self.argv, self.run_dir, "podman", stdin=procs.DEVNULL, stdout=self.out, stderr=self.err
        )
        self._booted = time.monotonic()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def booted_at(self) -> float | None:
        return self._booted

    def stop(self) -> None:
        if self.proc is not None and self.run_dir is not None:
            procs.finish(self.proc, self.run_dir, grace_s=30.0)

    def failure(self) -> ProvisionError:
        code = self.proc.returncode if self.proc is not None else None
        return VmFailed(f"`{' '.join(self.argv[:3])} …` exited ({code}) while serving", fix="see the log above")

    def details(self) -> dict[str, object]:
        return {"qemu_pid": None, "run_dir": None}
