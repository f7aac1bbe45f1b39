"""What `provision serve` keeps running, and every process operation serve needs, in one place.

Each running serve is one JSON file ``<cache>/serve/NAME.json`` owned by the process that
serves it (the foreground `provision serve`, or the supervisor `--detach` starts). Files are
written whole (temp name + rename; the first claim by hard link, so two serves never share a
name). An entry whose owner is gone (pid dead, or reused: the kernel start time differs) is
stale and removed whenever entries are listed.

Process handling for serve lives only here, on the owned process tree (adapters/procs.py: start
times, records): starting the supervisor, stopping an owner (SIGTERM, then SIGKILL of it and of
the processes below it). SIGTERM reaches a serve as KeyboardInterrupt (adapters/signals.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from provision.adapters import runner
from provision.core import outputs
from provision.core.errors import InvalidValue, ProvisionError, VmFailed, all_errors
from provision.core.paths import cache_dir

NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def state_dir() -> Path:
    return cache_dir("serve")


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise InvalidValue(
            f"serve name {name!r}: use lower-case letters, digits, '.', '_' or '-' (at most 63)",
            fix="provision serve STACK --name NAME",
        )
    return name


@dataclass(frozen=True)
class Entry:
    name: str
    pid: int
    pid_start: str
    stack: str
    model: str
    gpu: bool
    host: str
    port: int
    status: str = "starting"  # starting -> healthy
    started: float = field(default_factory=time.time)
    log: str | None = None
    run_dir: str | None = None
    qemu_pid: int | None = None
    stop: list[str] = field(default_factory=list)  # the model's stop strings, which `provision chat` sends

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "url": self.url}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def _path(name: str) -> Path:
    return state_dir() / f"{check_name(name)}.json"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all, fsynced (core/outputs.py: the one such writer); state files are ours."""
    outputs.write_text(path, json.dumps(data, indent=2) + "\n", flag="serve state", force=True)


def _load(path: Path) -> Entry | None:
    try:
        return Entry.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def own_entry(**fields: Any) -> Entry:
    """An entry owned by this process."""
    pid = os.getpid()
    return Entry(pid=pid, pid_start=process_start(pid) or "", **fields)


def claim(entry: Entry) -> Entry:
    """Record ``entry`` under its name; E003 when a live serve already has that name."""
    path = _path(entry.name)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.claim")
    tmp.write_text(json.dumps(entry.as_dict(), indent=2) + "\n")
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)  # fails if the name exists: no two owners
                return entry
            except FileExistsError:
                old = _load(path)
                if old is not None and alive(old.pid, old.pid_start):
                    raise InvalidValue(
                        f"a serve named {entry.name!r} already runs ({old.url}, pid {old.pid})",
                        fix=f"provision serve ... --name OTHER, or provision stop {entry.name}",
                    ) from None
                path.unlink(missing_ok=True)  # stale: its owner died
        raise InvalidValue(f"cannot claim serve name {entry.name!r} in {state_dir()}")
    finally:
        tmp.unlink(missing_ok=True)


def update(entry: Entry, **changes: Any) -> Entry:
    new = replace(entry, **changes)
    write_json_atomic(_path(new.name), new.as_dict())
    return new


def release(entry: Entry) -> None:
    """Remove the entry if this owner still holds it."""
    current = _load(_path(entry.name))
    if current is not None and current.pid == entry.pid:
        _path(entry.name).unlink(missing_ok=True)


def entries() -> list[Entry]:
    """Live serves, by name; stale files are removed on the way."""
    found = []
    for path in sorted(state_dir().glob("*.json")):
        entry = _load(path)
        if entry is None or not alive(entry.pid, entry.pid_start):
            path.unlink(missing_ok=True)
            continue
        found.append(entry)
    return found


def find(name: str) -> Entry:
    for entry in entries():
        if entry.name == name:
            return entry
    running = ", ".join(e.name for e in entries()) or "none"
    raise InvalidValue(f"no serve named {name!r} is running (running: {running})", fix="provision ps")


# --- processes ---------------------------------------------------------------------------------


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` as the entry stores it (None: gone, or a zombie)."""
    start = runner.start_time(pid)
    return None if start is None else str(start)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (QEMU and its helpers sit in process groups of their own)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (ppid := runner.parent(int(entry.name))) is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def alive(pid: int, start: str) -> bool:
    now = process_start(pid)
    return now is not None and (not start or now == start)


def terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def stop(entry: Entry, grace_s: float = 90.0) -> bool:
    """SIGTERM the owner and wait for it to stop its guest; after ``grace_s``, SIGKILL it and
    everything below it. True when it ended within the grace time."""
    if not alive(entry.pid, entry.pid_start):
        _path(entry.name).unlink(missing_ok=True)
        return True
    below = descendants(entry.pid)
    terminate(entry.pid)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not alive(entry.pid, entry.pid_start):
            _path(entry.name).unlink(missing_ok=True)
            return True
        time.sleep(0.2)
    for pid in [entry.pid, *below, *descendants(entry.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _path(entry.name).unlink(missing_ok=True)
    return False


def spawn_supervisor(args: Sequence[str], log: Path) -> runner.Child:
    """`python -m provision ARGS` in its own session, detached from the terminal, output to ``log``.
    Not tied (``tie=False``) and not kept in this process's records: it is meant to outlive this
    process, and its entry (NAME.json) is what `ps` and `stop` find it by."""
    with log.open("wb") as out:
        child = runner.start([sys.executable, "-m", "provision", *args], "serve-supervisor", tie=False,
                             stdin=runner.DEVNULL, stdout=out, stderr=runner.STDOUT)  # fmt: skip
    child.let_go()
    return child


def stop_supervisor(proc: runner.Process, grace_s: float = 120.0) -> None:
    """Ctrl-C while it starts: SIGTERM, so it stops its guest as on Ctrl-C; SIGKILL after ``grace_s``."""
    runner.stop_process(proc, grace_s=grace_s)


def write_report(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data)


def wait_report(proc: runner.Process, report: Path, log: Path) -> dict[str, Any]:
    """What the supervisor reported: ``{"entry": ...}`` once healthy; its error is raised here."""
    while True:
        if report.is_file():
            data: dict[str, Any] = json.loads(report.read_text())
            if "error" in data:
                raise rebuild_error(data["error"])
            return data
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise VmFailed(f"the serve supervisor exited ({proc.returncode}) before it was healthy: {tail}")
        time.sleep(0.2)


def rebuild_error(data: dict[str, Any]) -> ProvisionError:
    """The same error class (and so code and exit status) the supervisor raised."""
    for cls in all_errors():
        if cls.code == data.get("code"):
            return cls(str(data.get("message")), fix=data.get("fix"))
    return ProvisionError(str(data.get("message")), fix=data.get("fix"))
