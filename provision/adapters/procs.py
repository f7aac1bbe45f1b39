"""Every child process provision owns: started here, recorded in a run directory, stopped with it.

Three ties make a child die with the ``provision`` process that started it, however that ends:

1. ``spawn`` puts each child in a process group of its own (a terminal's Ctrl-C reaches only
   provision, which then stops its children in order) and, when called from the main thread, sets
   ``PR_SET_PDEATHSIG=SIGKILL`` in the child. That survives ``unshare``/``chroot``/``env`` execs but
   not a change of user (QEMU's ``-run-with user=``) and fires when the *thread* that forked exits,
   so it is a first line only.
2. A reaper (``provision/adapters/reaper.py``), started once per provision process, holds the read end of a
   pipe whose only write end provision keeps. End of file means provision is gone (exit, exception,
   SIGKILL): the reaper stops every group still recorded for that provision. It needs neither
   PDEATHSIG nor root.
3. Records: ``<run dir>/procs/<pid>.json`` per child (name, pid, process group, start time, owner
   pid and start time, argv). A start time (``/proc/PID/stat`` field 22) tells a reused pid apart.
   ``leftovers()`` lists live children whose owner is dead; ``clean_leftovers()`` (called at the
   start of every run) stops them; ``stop(run_dir)`` stops one run's children.

Records of a run live as long as its children; a child that ends normally is ``forget``-ed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from subprocess import Popen as Popen  # re-exported: the runner's callers need no subprocess
from subprocess import TimeoutExpired as TimeoutExpired
from typing import Any

from provision.adapters.signals import STOP_SIGNALS
from provision.core.paths import cache_dir

RECORDS = "procs"
STDOUT, PIPE, DEVNULL = subprocess.STDOUT, subprocess.PIPE, subprocess.DEVNULL  # callers need no subprocess
_log = logging.getLogger("provision.run")
PR_SET_PDEATHSIG = 1

try:
    _prctl: Any = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no PDEATHSIG, the reaper still works
    _prctl = None


@dataclass(frozen=True)
class Record:
    name: str
    pid: int
    pgid: int
    start: int
    owner: int
    owner_start: int
    argv: tuple[str, ...]

    def alive(self) -> bool:
        return start_time(self.pid) == self.start

    def owner_alive(self) -> bool:
        return start_time(self.owner) == self.owner_start


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat from field 3 on (the command name may hold spaces and parentheses)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it is gone or a zombie."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parent(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def process_group(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[2]) if fields else None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
                out.append(int(entry.name))
    return out


# --- starting children ------------------------------------------------------------------


def _child_setup(parent: int, pdeathsig: bool) -> Callable[[], None]:
    def setup() -> None:
        # The parent blocks the stop signals around fork; the program must get them again.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if pdeathsig and _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before prctl: nobody would send the signal
                os._exit(1)

    return setup


def spawn(
    argv: Sequence[str],
    run_dir: Path,
    name: str,
    *,
    keep_fds: Sequence[int] = (),
    tie: bool = True,
    **popen_kw: Any,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in its own process group, recorded in ``run_dir`` under ``name``.

    ``keep_fds`` stay open in the child (e.g. a GPU slot's flock, so the slot lives as long as the
    child). ``tie=False`` starts a child meant to outlive this process (a detached guest): it is
    recorded but neither the reaper nor PDEATHSIG stop it.
    """
    _log.info("+ %s", shlex.join(argv))  # -v shows every program provision runs
    if tie:
        _Reaper.get().watch(run_dir)
    # PDEATHSIG fires when the forking *thread* ends: only the main thread lives as long as provision.
    main = threading.current_thread() is threading.main_thread()
    setup = _child_setup(os.getpid(), pdeathsig=tie) if main else None
    # A stop signal between fork and the record would leave a child nobody knows: hold it off.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS) if main else None
    try:
        proc: subprocess.Popen[Any] = subprocess.Popen(
            list(argv), start_new_session=True, pass_fds=tuple(keep_fds), preexec_fn=setup, **popen_kw
        )
        started = start_time(proc.pid)
        if started is not None:
            owner, owner_start = (os.getpid(), start_time(os.getpid()) or 0) if tie else (0, 0)
            _write(run_dir, Record(name, proc.pid, proc.pid, started, owner, owner_start, tuple(argv)))
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return proc


def adopt(pid: int, run_dir: Path, name: str) -> Record | None:
    """Record a process one of ours started (the render server QEMU forks), so it is stopped with us."""
    started, pgid = start_time(pid), process_group(pid)
    if started is None or pgid is None:
        return None
    try:
        argv = tuple(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1])
    except OSError:
        argv = ()
    rec = Record(name, pid, pgid, started, os.getpid(), start_time(os.getpid()) or 0, argv)
    _Reaper.get().watch(run_dir)
    _write(run_dir, rec)
    return rec


def _write(run_dir: Path, rec: Record) -> None:
    d = run_dir / RECORDS
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{rec.pid}.json.tmp"
    tmp.write_text(json.dumps(asdict(rec)))
    tmp.rename(d / f"{rec.pid}.json")


def forget(pid: int, run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (run_dir / RECORDS / f"{pid}.json").unlink()


def record_of(pid: int, run_dir: Path) -> Record | None:
    return next((r for r in records(run_dir) if r.pid == pid), None)


def records(run_dir: Path) -> list[Record]:
    out: list[Record] = []
    try:
        paths = sorted((run_dir / RECORDS).iterdir())
    except OSError:
        return out  # no records, or the run directory was pruned while we looked
    for path in (p for p in paths if p.suffix == ".json"):
        try:
            data = json.loads(path.read_text())
            out.append(Record(**{**data, "argv": tuple(data["argv"])}))
        except (OSError, ValueError, TypeError, KeyError):
            continue  # a record half-written by a killed provision names nothing we can check
    return out


# --- stopping them ----------------------------------------------------------------------


def _ours(rec: Record) -> bool:
    # A pgid is not handed out again while any member lives, so when the leader is gone the
    # group holds only our orphans; when the leader's pid is alive but started at another
    # time it is someone else's process and its group is left alone.
    leader = start_time(rec.pgid)
    return not (rec.pgid == rec.pid and leader is not None and leader != rec.start)


def _signal_group(rec: Record, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(rec.pgid, sig)


def _group_gone(rec: Record) -> bool:
    return not rec.alive() and not group_members(rec.pgid)


def stop_records(recs: Iterable[Record], grace_s: float = 3.0) -> None:
    """SIGTERM each record's process group, then SIGKILL what is left after ``grace_s``."""
    todo = [r for r in recs if _ours(r) and not _group_gone(r)]
    for r in todo:
        _signal_group(r, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while todo and time.monotonic() < deadline:
        todo = [r for r in todo if not _group_gone(r)]
        if todo:
            time.sleep(0.05)
    for r in todo:
        _signal_group(r, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while todo and time.monotonic() < deadline:
        todo = [r for r in todo if not _group_gone(r)]
        if todo:
            time.sleep(0.05)


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
    """SIGTERM, wait, SIGKILL, reap: the pid never outlives this call (its group is finish's job)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finish(proc: subprocess.Popen[Any], run_dir: Path, grace_s: float = 3.0) -> None:
    """Stop one child we spawned and everything in its process group, reap it, drop its record."""
    rec = record_of(proc.pid, run_dir)
    stop_process(proc, grace_s)
    if rec is not None and group_members(rec.pgid):
        stop_records([rec], grace_s=1.0)
    forget(proc.pid, run_dir)


def stop(run_dir: Path, grace_s: float = 3.0, owner: tuple[int, int] | None = None) -> list[Record]:
    """Stop every recorded process of ``run_dir`` (only ``owner``'s, when given) and drop the records."""
    recs = [r for r in records(run_dir) if owner is None or (r.owner, r.owner_start) == owner]
    stop_records(recs, grace_s)
    for r in recs:
        forget(r.pid, run_dir)
    return recs


def record_dirs() -> list[Path]:
    """Every directory provision records children in: each run's, and each job's (builds)."""
    return [d for base in (cache_dir("runs"), cache_dir("jobs")) for d in base.iterdir() if (d / RECORDS).is_dir()]


def leftovers() -> list[tuple[Path, Record]]:
    """Recorded children still alive whose owner is dead (or that were started detached)."""
    return [(d, r) for d in record_dirs() for r in records(d) if r.owner and not r.owner_alive() and r.alive()]


def clean_leftovers(log: Callable[[str], None] | None = None) -> list[Record]:
    """Stop leftovers and drop every record whose owner is dead; returns what was stopped."""
    stopped = []
    for d in record_dirs():
        for r in records(d):
            if not r.owner or r.owner_alive():
                continue
            if r.alive() or group_members(r.pgid):
                if log:
                    log(f"stopping leftover {r.name} (pid {r.pid}) of a provision that died (pid {r.owner}, run {d})")
                stop_records([r])
                stopped.append(r)
            forget(r.pid, d)
        _drop_dead_job_dir(d)
    return stopped


_own_job_dirs: set[Path] = set()


def job_dir() -> Path:
    """This process's record directory for children that belong to no run (host tools, builds)."""
    d = cache_dir("jobs") / f"{os.getpid()}-{start_time(os.getpid()) or 0}"
    d.mkdir(exist_ok=True)
    if not _own_job_dirs:
        atexit.register(_drop_own_job_dirs)
    _own_job_dirs.add(d)
    return d


def _drop_own_job_dirs() -> None:
    # an empty one per command would pile up (a dry run too); one holding records waits for clean_leftovers
    for d in [d for d in _own_job_dirs if not records(d)]:
        shutil.rmtree(d, ignore_errors=True)


def _drop_dead_job_dir(d: Path) -> None:
    pid, _, start = d.name.partition("-")
    if d.parent.name == "jobs" and pid.isdigit() and str(start_time(int(pid))) != start and not records(d):
        shutil.rmtree(d, ignore_errors=True)


def run(
    argv: Sequence[str],
    name: str,
    *,
    run_dir: Path | None = None,
    input: Any = None,
    timeout: float | None = None,
    **popen_kw: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` for a child we own: stopped on any way out of this call, and with provision."""
    d = run_dir or job_dir()
    popen_kw.setdefault("stdout", subprocess.PIPE)
    popen_kw.setdefault("stderr", subprocess.PIPE)
    if input is not None:
        popen_kw["stdin"] = subprocess.PIPE
    p = spawn(argv, d, name, **popen_kw)
    try:
        out, err = p.communicate(input, timeout)
    finally:
        finish(p, d)
    return subprocess.CompletedProcess(list(argv), p.returncode, out, err)


# --- the reaper -------------------------------------------------------------------------


class _Reaper:
    """The one reaper process of this provision process (started on first use)."""

    _lock = threading.Lock()
    _instance: _Reaper | None = None

    def __init__(self) -> None:
        read_fd, self.write_fd = os.pipe()  # both ends close-on-exec: no child inherits them
        me = os.getpid()
        path = [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "provision.adapters.reaper", str(me), str(start_time(me) or 0)],
            stdin=read_fd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # holding provision's stderr would keep a reader of it waiting
            start_new_session=True,  # a signal to provision's process group must not reach it
            env=env,
        )
        os.close(read_fd)
        self.pid = os.getpid()
        self.watched: set[Path] = set()

    @classmethod
    def get(cls) -> _Reaper:
        with cls._lock:
            if cls._instance is None or cls._instance.pid != os.getpid() or cls._instance.proc.poll() is not None:
                cls._instance = _Reaper()
            return cls._instance

    def watch(self, run_dir: Path) -> None:
        with self._lock:
            if run_dir in self.watched:
                return
            os.write(self.write_fd, (str(run_dir.resolve()) + "\n").encode())
            self.watched.add(run_dir)


def reaper_pid() -> int | None:
    """The pid of this process's reaper, if one was started (tests look for it)."""
    inst = _Reaper._instance
    return inst.proc.pid if inst is not None and inst.pid == os.getpid() else None
