"""Fail fast when the APIR host side dies instead of letting the guest spin forever.

A dead render worker leaves the guest's frontend busy-waiting for a reply that never
comes, so `provision run` watches two things: the lines QEMU and the guest print (host
GGML aborts reach QEMU's stderr) and the render-server processes under QEMU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from provision.core.errors import GuestAborted

# (name, pattern, what it means)
FATAL_LINES: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("ggml-abort", re.compile(r"GGML_ABORT|GGML_ASSERT"), "the host ggml backend aborted"),
    ("ggml-missing-op", re.compile(r"ggml_vulkan: Error: Missing op"), "the host backend lacks an op the guest sent"),
    (
        "apir-capset",
        re.compile(r"failed to initialize the virtgpu APIR capset"),
        "the guest asked for the APIR capset, which this QEMU does not offer",
    ),
    (
        "render-ipc",
        re.compile(r"failed to (receive|send) message|failed to submit (cmd|large cmd buffer)"),
        "virglrenderer lost its render worker",
    ),
    ("kernel-panic", re.compile(r"Kernel panic"), "the guest kernel panicked"),
)


@dataclass(frozen=True)
class Death:
    kind: str
    evidence: str
    meaning: str

    def error(self) -> GuestAborted:
        return GuestAborted(
            f"{self.meaning} ({self.kind}): {self.evidence.strip()}",
            fix="see the QEMU log; `provision doctor` checks the APIR host setup (provision apir check)",
        )


def classify(line: str) -> Death | None:
    for kind, pattern, meaning in FATAL_LINES:
        if pattern.search(line):
            return Death(kind, line, meaning)
    return None


def _children(pid: int, proc: Path) -> list[int]:
    out: list[int] = []
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return out  # the process exited between being listed and being read
    for task in tasks:
        try:
            out.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def descendants(pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> command name of every process below ``pid``."""
    found: dict[int, str] = {}
    todo = _children(pid, proc)
    while todo:
        child = todo.pop()
        if child in found:
            continue
        try:
            found[child] = (proc / str(child) / "comm").read_text().strip()
        except OSError:
            continue
        todo.extend(_children(child, proc))
    return found


class WorkerWatch:
    """Remembers render-server processes seen under a root pid and reports one that vanished.

    A worker also exits normally when the guest program that owned its context ends, so a
    vanished worker is only a death if, within ``grace_s``, neither a new worker appears (the
    guest's next program opened its context) nor the guest shows progress: the runner calls
    ``progress()`` whenever the guest writes output.
    """

    def __init__(
        self,
        root_pid: int,
        *,
        grace_s: float = 45.0,
        names: re.Pattern[str] | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.root_pid = root_pid
        self.grace_s = grace_s
        self.names = names or re.compile(r"virgl|render|gpu_ren")
        self.proc = proc
        self.seen: dict[int, str] = {}
        self.pending: tuple[float, Death] | None = None

    def progress(self) -> None:
        self.pending = None

    def poll(self, now: float) -> Death | None:
        current = {p: n for p, n in descendants(self.root_pid, self.proc).items() if self.names.search(n)}
        if self.pending is not None and any(p not in self.seen for p in current):
            # A new worker: the guest opened its next context, so the old one simply ended.
            self.pending = None
        for pid, name in self.seen.items():
            if pid not in current and self.pending is None:
                evidence = f"process {pid} ({name}) under {self.root_pid} exited"
                self.pending = (now, Death("render-worker-exit", evidence, "the host render worker died"))
        self.seen = current
        if self.pending and now - self.pending[0] >= self.grace_s:
            return self.pending[1]
        return None
