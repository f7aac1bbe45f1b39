"""The one way provision runs a program: the spine's face over the owned process tree (procs).

``run`` resolves the program (missing: E006 naming it), logs the argv (``-v`` shows it; every
child started through ``procs.spawn`` is logged there), runs it as an owned child (stopped on
any way out, and with provision), streams its output with a tail when asked, and maps a
failure to the caller's E-code with the last lines in the message. ``probe`` is the quiet
variant for checks: ``None`` when the program is not installed. The idea comes from
cibuildwheel's ``util/cmd.call`` and pipx's ``run_subprocess``; the ownership is ours.
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
from typing import Any

from provision.adapters import procs
from provision.core.errors import ProvisionError, ToolMissing

TAIL = 25


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


def which(program: str, *, fix: str | None = None, path: str | None = None) -> str:
    """The program's full path; E006 naming it when it is not there."""
    if os.sep in program:
        if os.access(program, os.X_OK) and Path(program).is_file():
            return program
        raise ToolMissing(f"{program}: no such executable", fix=fix or f"install {Path(program).name} there")
    found = shutil.which(program, path=path)
    if found is None:
        raise ToolMissing(f"{program} is not installed (not on PATH)", fix=fix or f"install {program}")
    return found


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
    stream: Callable[[str], None] | None = None,
    tail: int = TAIL,
    text: bool = True,
    run_dir: Path | None = None,
    resolve: bool = True,
    **popen_kw: Any,
) -> Done:
    """Run ``argv`` to its end as an owned child. With ``error``, a non-zero exit or a timeout raises
    ``error(what exited N: last lines, fix=fix)``; without it the caller reads ``Done.status``.
    ``stream`` gets each output line as it comes (stdout and stderr merged), and the last ``tail``
    lines are kept for the message."""
    # the program is looked up on the PATH the child will have (the caller's env, if it names one)
    search = env.get("PATH") if env is not None else None
    argv = [which(argv[0], fix=missing_fix, path=search) if resolve else argv[0], *argv[1:]]
    name = Path(argv[0]).name
    kw: dict[str, Any] = {"env": dict(env) if env is not None else None, "cwd": cwd, **popen_kw}
    if stream is None:
        try:
            proc = procs.run(argv, name, run_dir=run_dir, input=input, timeout=timeout, text=text, **kw)
        except procs.TimeoutExpired:
            done = Done(tuple(argv), 124, "", f"{name} did not finish within {timeout:.0f} s", timed_out=True)
        else:
            raw = proc.stdout if isinstance(proc.stdout, bytes) else b""
            done = Done(tuple(argv), proc.returncode, _text(proc.stdout), _text(proc.stderr), raw=raw)
    else:
        done = _streamed(argv, name, stream, tail, timeout, run_dir, kw)
    if error is not None and not done.ok:
        how = f"did not finish within {timeout:.0f} s" if done.timed_out else f"exited {done.status}"
        raise error(f"{what or name} {how}:\n{done.last()}", fix=fix)
    return done


def _text(output: str | bytes | None) -> str:
    """Output as text (a child fed bytes, ``text=False``, may answer in any encoding)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _streamed(argv: list[str], name: str, stream: Callable[[str], None], tail: int, timeout: float | None,
              run_dir: Path | None, kw: dict[str, Any]) -> Done:  # fmt: skip
    d = run_dir or procs.job_dir()
    kept: collections.deque[str] = collections.deque(maxlen=tail)
    proc = procs.spawn(argv, d, name, stdin=procs.DEVNULL, stdout=procs.PIPE, stderr=procs.STDOUT,
                       text=True, errors="replace", bufsize=1, **kw)  # fmt: skip
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
            stream(line)
        proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        procs.finish(proc, d)
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


def elapsed(since: float) -> str:
    return f"{time.monotonic() - since:.1f} s"
