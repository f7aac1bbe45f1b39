"""provision/core/locks.py against real processes: one holder, the waiter told, a killed holder's lock freed."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from provision.core import locks

HOLDER = """
import sys
from provision.core import locks
with locks.held(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _take_in_thread(path: Path) -> tuple[threading.Thread, list[str]]:
    events: list[str] = []

    def take() -> None:
        with locks.held(path, waiting=lambda: events.append("waiting")):
            events.append("got it")

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, events


def test_a_second_holder_waits_is_told_and_gets_the_lock_when_the_first_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "model.lock"
    holder = _holder(path)
    thread, events = _take_in_thread(path)
    time.sleep(0.5)
    assert events == ["waiting"]  # told once, and still blocked while the other process holds it
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait(10) == 0
    thread.join(10)
    assert events == ["waiting", "got it"]
    assert path.is_file()  # the lock file stays: removing it would let two holders in


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = tmp_path / "build.lock"
    holder = _holder(path)
    thread, events = _take_in_thread(path)
    time.sleep(0.3)
    assert events == ["waiting"]
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    thread.join(10)
    assert events == ["waiting", "got it"]


def test_a_free_lock_is_taken_without_waiting_and_threads_exclude_each_other(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    told: list[str] = []
    with locks.held(path, waiting=lambda: told.append("waiting")):
        thread, events = _take_in_thread(path)  # another thread of this process: another open, another lock
        time.sleep(0.3)
        assert events == ["waiting"]
    thread.join(10)
    assert told == [] and events == ["waiting", "got it"]
