"""The one way provision runs a program: the only face over the owned process tree (procs).

``run`` resolves the program (missing: E006 naming it), logs the argv (``-v`` shows it), runs it
as an owned child (stopped on any way out, and with provision), hands each output line to
``on_line`` when asked while keeping the last ``tail`` lines, and maps a failure to the
caller's E-code with those lines in the message. ``probe`` is the quiet variant for checks:
``None`` when the program is not installed. ``start`` gives a handle (``Child``) on a child
that outlives the call (QEMU, a server, one end of a pipe); ``finish`` stops it with its
process group. The process tree's queries and stops (records, leftovers, a run's children)
are reached here too, so nothing else imports ``procs`` (tests/test_architecture.py holds it).
The idea comes from cibuildwheel's ``util/cmd.call`` and pipx's ``run_subprocess``; the
ownership is ours.
"""

from __future__ import annotations

import collections
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from provision.adapters import procs
from provision.core import settings as settings_mod
from provision.core.errors import ProvisionError, ToolMissing

TAIL = 25
# What callers hand to a child's standard streams and catch from a wait, without importing subprocess.
DEVNULL, PIPE, STDOUT = procs.DEVNULL, procs.PIPE, procs.STDOUT
TimeoutExpired = procs.TimeoutExpired
Record = procs.Record


@dataclass(frozen=True)
class Done:
    argv: tuple[str, ...]
    status: int
    out: str
    err: str
    tail: tuple[str, ...] = ()  # the last lines of a streamed run (stdout and stderr together)
    timed_out: bool = False
    raw: bytes = b""  # stdout as bytes, with ``text=False`` (a binary diff, an archive)

    @property
    def ok(self) -> bool:
        return self.status == 0 and not self.timed_out

    def last(self, lines: int = 12) -> str:
        text = "\n".join(self.tail) if self.tail else (self.err.strip() or self.out.strip())
        return "\n".join(text.splitlines()[-lines:])


def found(program: str, *, path: str | None = None) -> str | None:
    """The program's full path, or None when it is not there (a check that lists what is missing)."""
    if os.sep in program:
        return program if os.access(program, os.X_OK) and Path(program).is_file() else None
    return shutil.which(program, path=path)


def which(program: str, *, fix: str | None = None, path: str | None = None) -> str:
    """The program's full path; E006 naming it when it is not there."""
    where = found(program, path=path)
    if where is not None:
        return where
    if os.sep in program:
        raise ToolMissing(f"{program}: no such executable", fix=fix or f"install {Path(program).name} there")
    raise ToolMissing(f"{program} is not installed (not on PATH)", fix=fix or f"install {program}")


def child_env(env: Mapping[str, str] | None, settings: settings_mod.Settings | None = None) -> dict[str, str] | None:
    """A child's environment: ``env`` (None: this process's) with the command's settings that came
    from a file or ``--set`` as the ``PROVISION_*`` variables they stand for, so a provision child
    (the serve supervisor) sees the same settings. None when there is nothing to add to ours."""
    bridged = (settings or settings_mod.current()).environ()
    if not bridged:
        return dict(env) if env is not None else None
    return {**(os.environ if env is None else env), **bridged}


def run(
    argv: Sequence[str],
    *,
    error: type[ProvisionError] | None = None,
    what: str | None = None,
    fix: str | None = None,
    missing_fix: str | None = None,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    input: str | bytes | None = None,
    on_line: Callable[[str], None] | None = None,
    tail: int = TAIL,
    text: bool = True,
    run_dir: Path | None = None,
    resolve: bool = True,
    name: str | None = None,
    grace_s: float = 3.0,
    settings: settings_mod.Settings | None = None,
    **popen_kw: Any,
) -> Done:
    """Run ``argv`` to its end as an owned child. With ``error``, a non-zero exit or a timeout raises
    ``error(what exited N: last lines, fix=fix)``; without it the caller reads ``Done.status``.
    ``on_line`` gets each output line as it comes (stdout and stderr merged, bytes that are
    not UTF-8 replaced), and the last ``tail`` lines are kept for the message and ``Done.tail``.
    ``name`` is the child's record name (default: the program's); ``grace_s`` is how long a
    streamed child cut short gets between SIGTERM and SIGKILL; ``settings`` are the command's,
    whose file and ``--set`` values the child gets (``child_env``)."""
    # the program is looked up on the PATH the child will have (the caller's env, if it names one)
    search = env.get("PATH") if env is not None else None
    argv = [which(argv[0], fix=missing_fix, path=search) if resolve else argv[0], *argv[1:]]
    name = name or Path(argv[0]).name
    kw: dict[str, Any] = {"env": child_env(env, settings), "cwd": cwd, **popen_kw}
    if on_line is None:
        try:
            proc = procs.run(argv, name, run_dir=run_dir, input=input, timeout=timeout, text=text, **kw)
        except procs.TimeoutExpired:
            done = Done(tuple(argv), 124, "", f"{name} did not finish within {timeout:.0f} s", timed_out=True)
        else:
            raw = proc.stdout if isinstance(proc.stdout, bytes) else b""
            done = Done(tuple(argv), proc.returncode, _text(proc.stdout), _text(proc.stderr), raw=raw)
    else:
        done = _streamed(argv, name, on_line, tail, timeout, run_dir, grace_s, kw)
    if error is not None and not done.ok:
        how = f"did not finish within {timeout:.0f} s" if done.timed_out else f"exited {done.status}"
        raise error(f"{what or name} {how}:\n{done.last()}", fix=fix)
    return done


def _text(output: str | bytes | None) -> str:
    """Output as text (a child fed bytes, ``text=False``, may answer in any encoding)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _streamed(argv: list[str], name: str, on_line: Callable[[str], None], tail: int, timeout: float | None,
              run_dir: Path | None, grace_s: float, kw: dict[str, Any]) -> Done:  # fmt: skip
    d = run_dir or procs.job_dir()
    kept: collections.deque[str] = collections.deque(maxlen=tail)
    kw.setdefault("stdin", procs.DEVNULL)
    proc = procs.spawn(argv, d, name, stdout=procs.PIPE, stderr=procs.STDOUT, text=True, errors="replace",
                       bufsize=1, **kw)  # fmt: skip
    expired = threading.Event()
    timer = None
    if timeout is not None:
        def expire() -> None:
            expired.set()
            procs.stop_process(proc, grace_s=2.0)

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            kept.append(line)
            on_line(line)
        proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        procs.finish(proc, d, grace_s=grace_s)
    return Done(tuple(argv), 124 if expired.is_set() else proc.returncode, "", "", tuple(kept), expired.is_set())


def probe(
    argv: Sequence[str], *, timeout: float = 30.0, env: Mapping[str, str] | None = None
) -> tuple[int, str] | None:
    """(exit status, stdout+stderr) of a quick check, or None when the program is not installed."""
    try:
        done = run(argv, timeout=timeout, env=env)
    except ToolMissing:
        return None
    return done.status, done.out + done.err


class Process(Protocol):
    """What the stop and the watch need of a running child: a ``Child`` or a bare ``Popen``."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | Any: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class Child:
    """An owned child that outlives the call that started it: its own process group, a record in
    ``run_dir``, stopped with provision. ``finish`` (or leaving a ``with`` block) stops it and
    everything in its group, reaps it and drops its record."""

    def __init__(self, proc: procs.Popen[Any], run_dir: Path, name: str) -> None:
        self.proc, self.run_dir, self.name = proc, run_dir, name

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | Any:
        return self.proc.returncode

    @property
    def stdin(self) -> IO[Any] | None:
        return self.proc.stdin

    @property
    def stdout(self) -> IO[Any] | None:
        return self.proc.stdout

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.kill()

    def finish(self, grace_s: float = 3.0) -> None:
        procs.finish(self.proc, self.run_dir, grace_s=grace_s)

    def let_go(self) -> None:
        """Drop its record: a child started with ``tie=False`` that is meant to outlive provision."""
        procs.forget(self.proc.pid, self.run_dir)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()


def start(
    argv: Sequence[str],
    name: str,
    *,
    run_dir: Path | None = None,
    keep_fds: Sequence[int] = (),
    tie: bool = True,
    resolve: bool = True,
    missing_fix: str | None = None,
    env: Mapping[str, str] | None = None,
    settings: settings_mod.Settings | None = None,
    **popen_kw: Any,
) -> Child:
    """Start ``argv`` as an owned child and return its handle (the argv logged, ``-v`` shows it).

    ``run_dir`` holds its record (default: this process's job directory); ``keep_fds`` stay open
    in it (a GPU slot's lock lives as long as QEMU); ``tie=False`` is a child meant to outlive
    provision (a detached server). The program is resolved on the PATH it will have (E006); its
    environment is ``child_env(env, settings)``."""
    search = env.get("PATH") if env is not None else None
    argv = [which(argv[0], fix=missing_fix, path=search) if resolve else argv[0], *argv[1:]]
    d = run_dir or procs.job_dir()
    return Child(procs.spawn(argv, d, name, keep_fds=keep_fds, tie=tie, env=child_env(env, settings), **popen_kw),
                 d, name)


def stop_process(proc: Process, grace_s: float = 5.0) -> None:
    """SIGTERM, wait ``grace_s``, SIGKILL, reap: the pid never outlives this call."""
    procs.stop_process(proc, grace_s)  # type: ignore[arg-type]


# --- the process tree: who is ours, and stopping what a run or a dead provision left ----------


def job_dir() -> Path:
    """This process's record directory for children that belong to no run (tools, builds)."""
    return procs.job_dir()


def records(run_dir: Path) -> list[Record]:
    return procs.records(run_dir)


def stop_run(run_dir: Path, grace_s: float = 3.0, owner: tuple[int, int] | None = None) -> list[Record]:
    """Stop every recorded child of ``run_dir`` (only ``owner``'s, when given) with its process group."""
    return procs.stop(run_dir, grace_s, owner)


def clean_leftovers(log: Callable[[str], None] | None = None) -> list[Record]:
    """Stop the children of a provision that died, and drop their records."""
    return procs.clean_leftovers(log)


def adopt(pid: int, run_dir: Path, name: str) -> Record | None:
    """Record a process one of ours started (the render server QEMU forks), so it stops with us."""
    return procs.adopt(pid, run_dir, name)


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): tells a reused pid apart; None when gone."""
    return procs.start_time(pid)


def parent(pid: int) -> int | None:
    return procs.parent(pid)


def children_running(owner: int) -> bool:
    """Whether a recorded child of provision ``owner`` still runs (the reaper may be stopping it)."""
    return any(r.owner == owner and r.alive() for d in procs.record_dirs() for r in procs.records(d))


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:.1f} s"
