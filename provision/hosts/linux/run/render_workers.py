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

The watch judges QEMU's context sockets, not the workers it happens to see: the kernel says
when the other end of one is gone (unix_peers), so a worker that lives and dies between two
polls is judged like any other, and a short-lived program that comes and goes unseen had
closed its context anyway.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import unix_peers
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


def render_peers() -> dict[int, int]:
    """The render protocol's sockets (seqpacket pairs, server/render_socket.c): inode -> peer, 0 once closed."""
    return unix_peers.peers(socket.SOCK_SEQPACKET)


@dataclass
class _Context:
    """One socket QEMU holds whose other end a render process held: a guest context (or the server's channel)."""

    owner: int  # the render process last seen holding the other end
    name: str
    opened: float
    gone_since: float | None = None  # when the other end was first seen closed
    status: str = ""  # how its owner ended, as /proc told it then
    counted: bool = False  # a worker (not the server) held it: one guest context


class WorkerWatch:
    """Render contexts QEMU holds; reports one whose render worker ended while QEMU still held it.

    Every poll asks the kernel which render sockets QEMU (and its non-render helpers) hold and
    whether each one's other end is still open. A context whose other end is closed while QEMU
    still holds it ``confirm_s`` later is a death: on a normal end QEMU closes its end first,
    or within moments when the server's SIGKILL wins the race.
    """

    def __init__(
        self,
        root_pid: int,
        *,
        confirm_s: float = 2.0,
        proc: Path = Path("/proc"),
        peers: Callable[[], dict[int, int]] = render_peers,
    ) -> None:
        self.root_pid = root_pid
        self.confirm_s = confirm_s
        self.proc = proc
        self.peers = peers
        self.contexts: dict[int, _Context] = {}  # QEMU's socket inode -> its context
        self.workers: dict[int, str] = {}  # every render worker seen alive: pid -> name
        self.blind = False  # the kernel would not pair sockets here: worker ends cannot be judged
        self.polls = 0
        # What the watch saw, for the run's record (workers.json): proof that it judged anything.
        self.counts = {"workers_seen": 0, "contexts": 0, "closed": 0, "closed_after_worker_end": 0}
        self.record: list[dict[str, object]] = []  # each closed context: who held it, when it opened and closed

    def poll(self, now: float) -> Death | None:
        self.polls += 1
        below = tree(self.root_pid, self.proc)
        render = {p for p, (_parent, name) in below.items() if RENDER_SERVER.match(name) or WORKER.match(name)}
        render |= {p for p, (parent, _name) in below.items() if parent in render}  # a fresh fork, not yet renamed
        for pid in render:
            name = below[pid][1]
            if WORKER.match(name) and pid not in self.workers and zombie_status(pid, self.proc) is None:
                self.workers[pid] = name
                self.counts["workers_seen"] += 1
        if self.blind:
            return None
        try:
            pairs = self.peers()
        except OSError:
            self.blind = True
            return None
        held = unix_peers.open_sockets(self.root_pid, self.proc)
        for pid in below:
            if pid not in render:
                held |= unix_peers.open_sockets(pid, self.proc)
        # Right after a fork both the server and its new worker hold the worker's end: the worker is its owner.
        owners = {
            ino: pid
            for pid in sorted(render, key=lambda p: bool(WORKER.match(below[p][1])))
            for ino in unix_peers.open_sockets(pid, self.proc)
        }
        for mine in held & pairs.keys():
            death = self._judge(mine, pairs, owners, below, now)
            if death is not None:
                return death
        for mine in [s for s in self.contexts if s not in held]:  # QEMU closed it: the guest program ended it
            ctx = self.contexts.pop(mine)
            if ctx.counted:
                self.counts["closed"] += 1
                self.counts["closed_after_worker_end"] += ctx.gone_since is not None
                self.record.append({"worker": f"{ctx.owner} {ctx.name}", "opened": round(ctx.opened, 2),
                                    "worker_end": ctx.gone_since and round(ctx.gone_since, 2),
                                    "closed": round(now, 2)})
        return None

    def _judge(
        self, mine: int, pairs: dict[int, int], owners: dict[int, int], below: dict[int, tuple[int, str]], now: float
    ) -> Death | None:
        theirs = pairs[mine]
        open_ = theirs != 0 and theirs in pairs
        ctx = self.contexts.get(mine)
        if ctx is None:
            if open_ and theirs not in owners:
                return None  # a pair between QEMU's own processes, or with something outside: not a render context
            ctx = self.contexts[mine] = _Context(0, "a render worker that ended before the watch saw it", now)
        if open_:
            owner = owners.get(theirs)
            if owner is not None and owner in below:  # the server holds it first, then its fresh worker
                ctx.owner, ctx.name = owner, below[owner][1]
                if WORKER.match(ctx.name) and not ctx.counted:
                    ctx.counted = True
                    self.counts["contexts"] += 1
            ctx.gone_since = None
            return None
        if ctx.gone_since is None:
            ctx.gone_since, ctx.status = now, zombie_status(ctx.owner, self.proc) or "running, socket closed"
        if now - ctx.gone_since < self.confirm_s:
            return None
        evidence = (
            f"render worker {ctx.owner} ({ctx.name}, {ctx.status}) under {self.root_pid} ended while QEMU "
            f"still held its context (socket {mine}) for {now - ctx.gone_since:.1f} s"
        )
        return Death("render-worker-exit", evidence, "the host render worker died with its guest context open")
