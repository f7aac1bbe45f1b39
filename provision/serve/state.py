"""What `provision serve` keeps running, and every process operation serve needs, in one place.

Each running serve is one JSON file ``<cache>/serve/NAME.json`` owned by the process that
serves it (the foreground `provision serve`, or the supervisor `--detach` starts). Files are
written whole (temp name + rename; the first claim by hard link, so two serves never share a
name). An entry whose owner is gone (pid dead, or reused: the kernel start time differs) is
stale and removed whenever entries are listed.

Process handling for serve lives only here: reading a pid's start time, starting the
supervisor, stopping an owner (SIGTERM, then SIGKILL of it and of the processes below it).
SIGTERM reaches a serve as KeyboardInterrupt (adapters/signals.py); adapters/procs.py records and
reaps the guest's own processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


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
    """The kernel's start time of ``pid`` (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None  # exited, not yet reaped
    return fields[19]


def alive(pid: int, start: str) -> bool:
    now = process_start(pid)
    return now is not None and (not start or now == start)


def terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def stop(entry: Entry, grace_s: float = 90.0) -> bool:
    """SIGTERM the owner and wait for it to stop its guest; after ``grace_s``, SIGKILL it and
    everything below it. True when it ended within the grace time."""
    from provision.hosts.linux import watchdog  # /proc walking; only for this fallback

    if not alive(entry.pid, entry.pid_start):
        _path(entry.name).unlink(missing_ok=True)
        return True
    below = list(watchdog.descendants(entry.pid))
    terminate(entry.pid)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not alive(entry.pid, entry.pid_start):
            _path(entry.name).unlink(missing_ok=True)
            return True
        time.sleep(0.2)
    for pid in [entry.pid, *below, *watchdog.descendants(entry.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _path(entry.name).unlink(missing_ok=True)
    return False


def spawn_supervisor(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """`python -m provision ARGS` in its own session, detached from the terminal, output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "provision", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def write_report(path: Path, data: dict[str, Any]) -> None:
    write_json_atomic(path, data)


def wait_report(proc: subprocess.Popen[bytes], report: Path, log: Path) -> dict[str, Any]:
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
