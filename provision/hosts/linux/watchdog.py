"""Fail fast when the APIR host side dies instead of letting the guest spin forever.

A dead render worker leaves the guest's frontend busy-waiting for a reply that never
comes, so `provision run` watches two things: the lines QEMU and the guest print (host
GGML aborts reach QEMU's stderr) and the render workers under QEMU.

How a worker ends, from virglrenderer's server/ (render_client.c, render_worker.c,
render_context.c, main.c): the render server forks one worker per guest context and gives
it one end of a socket pair; QEMU holds the other end. When the guest program closes its
context, QEMU sends DESTROY_CONTEXT and closes its end: the worker reads EOF and exits with
status 255 (``render_context_run`` only returns on a failed read, and ``main`` turns that
into -1), or the server SIGKILLs it first. So neither the exit status nor a signal tells a
normal end from a crash. What does: a worker that ends while QEMU still holds its end of
the pair ended with its context open, and the guest is waiting on it. That is the one
worker end counted as a death; a guest may be silent for as long as its timeout allows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.core.errors import GuestAborted
from provision.hosts.linux import unix_peers

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


def tree(pid: int, proc: Path = Path("/proc")) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command name) of every process below ``pid``."""
    found: dict[int, tuple[int, str]] = {}
    todo = [(c, pid) for c in _children(pid, proc)]
    while todo:
        child, parent = todo.pop()
        if child in found:
            continue
        try:
            found[child] = (parent, (proc / str(child) / "comm").read_text().strip())
        except OSError:
            continue
        todo.extend((c, child) for c in _children(child, proc))
    return found


def descendants(pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> command name of every process below ``pid``."""
    return {p: name for p, (_parent, name) in tree(pid, proc).items()}


def zombie_status(pid: int, proc: Path = Path("/proc")) -> str | None:
    """How an exited, not yet reaped process ended ("exit status 255", "signal 9"); None if it runs."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "gone"
    if fields[0] != "Z":
        return None
    code = int(fields[49]) if len(fields) > 49 else 0  # field 52, exit_code, as waitpid reports it
    return f"signal {code & 0x7F}" if code & 0x7F else f"exit status {code >> 8}"


# /proc/PID/comm keeps 15 characters: the server is "virgl_render_se", its workers "virgl-N-…".
RENDER_SERVER = re.compile(r"^virgl_render")
WORKER = re.compile(r"^virgl-\d+-")


@dataclass
class _Worker:
    name: str
    context: set[int]  # inodes of the sockets QEMU holds whose peers are this worker's


class WorkerWatch:
    """Render workers under QEMU; reports one that ended while its guest context was still open.

    A worker is a child of the render server. While it runs, the watch records which of its
    sockets' peers QEMU holds (its context). Once it is gone, it was a death only if QEMU
    still holds that context ``confirm_s`` later: a normal end has QEMU close its end first
    (or within moments, when the server's SIGKILL wins the race).
    """

    def __init__(
        self,
        root_pid: int,
        *,
        confirm_s: float = 2.0,
        proc: Path = Path("/proc"),
        peers: Callable[[], dict[int, int]] = unix_peers.peers,
    ) -> None:
        self.root_pid = root_pid
        self.confirm_s = confirm_s
        self.proc = proc
        self.peers = peers
        self.workers: dict[int, _Worker] = {}
        self.ended: dict[int, tuple[float, _Worker, str]] = {}  # ended with its context held: since when
        self.blind = False  # the kernel would not pair sockets here: worker ends cannot be judged
        # What the watch saw, for the run's record (workers.json): proof that it judged anything.
        self.counts = {"seen": 0, "paired": 0, "ended_with_context_closed": 0, "ended_unjudged": 0}

    def _holders(self, below: dict[int, tuple[int, str]], workers: set[int]) -> set[int]:
        """Socket inodes held by QEMU (the root) and every other non-render process in its tree."""
        held = unix_peers.open_sockets(self.root_pid, self.proc)
        for pid, (_parent, name) in below.items():
            if pid not in workers and not RENDER_SERVER.match(name):
                held |= unix_peers.open_sockets(pid, self.proc)
        return held

    def poll(self, now: float) -> Death | None:
        below = tree(self.root_pid, self.proc)
        servers = {p for p, (_parent, name) in below.items() if RENDER_SERVER.match(name)}
        live: dict[int, str] = {}
        for pid, (parent, name) in below.items():
            if parent in servers:
                status = zombie_status(pid, self.proc)
                if status is None:
                    live[pid] = name
                elif pid in self.workers and pid not in self.ended:
                    self.ended[pid] = (now, self.workers.pop(pid), status)
        held = self._holders(below, set(live))
        # Until it has renamed itself ("virgl-N-…", after its setup) a fresh fork still holds
        # the server's own sockets; the context is a socket that no server holds too.
        unpaired = [p for p in live if WORKER.match(live[p]) and not self.workers.get(p, _Worker("", set())).context]
        pairs: dict[int, int] = {}
        if unpaired and not self.blind:
            try:
                pairs = self.peers()
            except OSError:
                self.blind = True
        shared: set[int] = set()
        for pid in servers:
            shared |= unix_peers.open_sockets(pid, self.proc)
        for pid in live:
            if pid not in self.workers:
                self.counts["seen"] += 1
                self.workers[pid] = _Worker(live[pid], set())
        for pid in unpaired:
            mine = unix_peers.open_sockets(pid, self.proc) - shared
            context = {pairs[s] for s in mine if pairs.get(s) in held}
            if context:
                self.counts["paired"] += 1
                self.workers[pid] = _Worker(live[pid], context)
        for pid in [p for p in self.workers if p not in live]:
            self.ended[pid] = (now, self.workers.pop(pid), "reaped")
        for pid, (since, worker, status) in list(self.ended.items()):
            still_open = worker.context & held
            if not still_open:
                del self.ended[pid]  # QEMU closed the context: the guest program ended it
                self.counts["ended_with_context_closed" if worker.context else "ended_unjudged"] += 1
            elif now - since >= self.confirm_s:
                evidence = (
                    f"render worker {pid} ({worker.name}, {status}) under {self.root_pid} ended while QEMU "
                    f"still held its context (socket {min(still_open)}) for {now - since:.1f} s"
                )
                return Death("render-worker-exit", evidence, "the host render worker died with its guest context open")
        return None
