"""`provision serve` on macOS: the guest is one host process, `podman run` with the port published.

Stopping it is SIGTERM, which podman passes to the container (``--rm`` then removes it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import BinaryIO

from provision.adapters import runner
from provision.core.errors import ProvisionError, VmFailed


class ProcessGuest:
    """A guest that is one host process (`podman run` on macOS): stopping it is SIGTERM, which
    podman passes to the container (--rm then removes it)."""

    def __init__(self, argv: list[str], *, out: BinaryIO, err: BinaryIO) -> None:
        self.argv, self.out, self.err = argv, out, err
        self.proc: runner.Child | None = None
        self._booted: float | None = None

    def start(self) -> None:
        self.proc = runner.start(self.argv, "podman", stdin=runner.DEVNULL, stdout=self.out, stderr=self.err)
        self._booted = time.monotonic()

    @property
    def run_dir(self) -> Path | None:
        """Where its record is kept while it runs."""
        return self.proc.run_dir if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def booted_at(self) -> float | None:
        return self._booted

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.finish(grace_s=30.0)

    def failure(self) -> ProvisionError:
        code = self.proc.returncode if self.proc is not None else None
        return VmFailed(f"`{' '.join(self.argv[:3])} …` exited ({code}) while serving", fix="see the log above")

    def details(self) -> dict[str, object]:
        return {"qemu_pid": None, "run_dir": None}
