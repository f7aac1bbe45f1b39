"""serve's processes on the owned tree: the /proc walk that finds what is below an owner, the
supervisor started detached, and the darwin guest (one host process) stopped and reaped."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from provision.adapters import procs
from provision.hosts.darwin.serve import ProcessGuest
from provision.serve import state as serve_state


def _wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _sleeping(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"):
                found.append(pid)
        except OSError:  # gone meanwhile
            pass
    return found


def test_descendants_finds_a_grandchild_in_another_process_group(tmp_path: Path) -> None:
    # sh -> setsid sleep: the grandchild leaves sh's group, as QEMU's helpers leave provision's.
    proc = procs.spawn(["sh", "-c", "setsid sleep 30 & wait"], tmp_path, "sh", stdout=procs.DEVNULL)
    try:
        # Wait for sleep itself: the first descendant seen may still be sh's fork, before setsid execs sleep.
        assert _wait_for(lambda: bool(_sleeping(serve_state.descendants(proc.pid)))), serve_state.descendants(proc.pid)
        below = serve_state.descendants(proc.pid)
        assert all(procs.start_time(p) is not None for p in below)
        [sleeper] = _sleeping(below)
        assert os.getpgid(sleeper) != os.getpgid(proc.pid)  # found by parentage, not by group
        assert serve_state.process_start(proc.pid) == str(procs.start_time(proc.pid))
    finally:
        procs.stop(tmp_path)
        procs.finish(proc, tmp_path)
    assert serve_state.process_start(proc.pid) is None


def test_the_supervisor_is_detached_and_not_in_our_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "sup.log"
    proc = serve_state.spawn_supervisor(["--version"], log)
    assert proc.wait(timeout=60) == 0
    assert "provision" in log.read_text()
    assert procs.records(procs.job_dir()) == []


def test_a_process_guest_stops_and_is_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err:
        guest = ProcessGuest([sys.executable, "-c", "import time; time.sleep(60)"], out=out, err=err)
        guest.start()
    assert guest.running() and guest.booted_at() is not None and guest.proc is not None
    pid = guest.proc.pid
    assert guest.run_dir is not None and procs.record_of(pid, guest.run_dir) is not None
    guest.stop()
    assert not guest.running() and procs.start_time(pid) is None
    assert procs.record_of(pid, guest.run_dir) is None
    assert "exited" in guest.failure().message
