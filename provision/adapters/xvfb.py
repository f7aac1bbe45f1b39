"""Xvfb: an X server of our own for QEMU's SDL GL display where there is no render node.

QEMU's virtio-gpu-gl needs an OpenGL display backend. ``egl-headless`` needs a DRM render
node; without one, Mesa's llvmpipe EGL on an X11 server works. Xvfb picks a free display
itself (``-displayfd``) so concurrent runs never race for a number.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import procs
from provision.adapters.chroot import Chroot
from provision.core.errors import VmFailed


@dataclass
class Xvfb:
    process: procs.Popen[bytes]
    display: str

    @property
    def pid(self) -> int:
        return self.process.pid

    run_dir: Path

    def stop(self) -> None:
        procs.finish(self.process, self.run_dir)


def start(
    chroot: Chroot | None,
    log: Path,
    timeout_s: float = 20.0,
    run_dir: Path | None = None,
    *,
    wrap: Callable[[list[str]], list[str]] | None = None,
) -> Xvfb:
    """Start Xvfb (in ``chroot`` when given, else as ``wrap`` runs it; recorded in ``run_dir``,
    default the log's directory) and return once it accepts clients."""
    run_dir = run_dir or log.parent
    read_fd, write_fd = os.pipe()
    program = ["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1024x768x24", "-nolisten", "tcp", "-noreset"]
    argv = chroot.argv(program) if chroot else (wrap(program) if wrap else program)
    with log.open("wb") as out:
        proc = procs.spawn(
            argv,
            run_dir,
            "xvfb",
            keep_fds=(write_fd,),
            stdin=procs.DEVNULL,
            stdout=out,
            stderr=procs.STDOUT,
        )
    os.close(write_fd)
    deadline = time.monotonic() + timeout_s
    data = b""
    try:
        while time.monotonic() < deadline and not data.endswith(b"\n"):
            ready, _, _ = select.select([read_fd], [], [], 0.2)
            if ready:
                chunk = os.read(read_fd, 64)
                if not chunk:
                    break
                data += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(read_fd)
    if not data.strip().isdigit():
        procs.finish(proc, run_dir)
        tail = log.read_text(errors="replace")[-600:] if log.exists() else ""
        raise VmFailed(
            f"Xvfb did not start (log {log}): {tail}", fix="check the host tools: provision host-tools --check"
        )
    return Xvfb(proc, f":{int(data.strip())}", run_dir)
