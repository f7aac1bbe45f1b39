"""Process lifetimes with real processes (no VM): every child provision starts dies with it,
however provision ends, and a GPU slot's lock lives exactly as long as the process holding it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision.adapters import procs
from provision.hosts.linux.run import slots

# A stand-in for `provision run`: starts a child (a shell with a grandchild in its group) the way
# the run does, prints the pids, then waits; it unwinds on signals exactly like provision's main.
OWNER = textwrap.dedent(
    """
    import json, sys, threading, time
    from pathlib import Path
    from provision.adapters import procs, signals

    run_dir, thread = Path(sys.argv[1]), sys.argv[2] == "thread"
    signals.stop_on_signals()
    box = {}
    def start():
        box["p"] = procs.spawn(["sh", "-c", "sleep 300 & echo $! > grandchild; wait"], run_dir, "child", cwd=run_dir)
    try:
        if thread:  # no PDEATHSIG from a thread that ends: only the reaper can stop the child
            t = threading.Thread(target=start); t.start(); t.join()
        else:
            start()
        while not (run_dir / "grandchild").is_file() or not (run_dir / "grandchild").read_text().endswith("\\n"):
            time.sleep(0.02)
        print(json.dumps({"child": box["p"].pid, "grandchild": int((run_dir / "grandchild").read_text()),
                          "reaper": procs.reaper_pid()}), flush=True)
        time.sleep(300)
    except KeyboardInterrupt as exc:
        print("teardown", flush=True)  # the unwinding has begun: the second-signal test waits for this
        if "p" in box:
            procs.finish(box["p"], run_dir)
        sys.exit(signals.exit_status(exc))
    """
)


def alive(pid: int) -> bool:
    return procs.start_time(pid) is not None


def wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def start_owner(run_dir: Path, cache: Path, mode: str = "main") -> tuple[subprocess.Popen[str], dict[str, int]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(run_dir), mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PROVISION_CACHE": str(cache)},
    )
    assert owner.stdout is not None
    pids = json.loads(owner.stdout.readline())
    return owner, pids


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_spawn_gives_a_process_group_of_its_own_and_records_it(tmp_path: Path) -> None:
    p = procs.spawn(["sleep", "30"], tmp_path, "sleeper")
    try:
        assert os.getpgid(p.pid) == p.pid != os.getpgid(0)
        (rec,) = procs.records(tmp_path)
        assert (rec.name, rec.pid, rec.pgid, rec.owner) == ("sleeper", p.pid, p.pid, os.getpid())
        assert rec.start == procs.start_time(p.pid) and rec.alive() and rec.owner_alive()
    finally:
        procs.finish(p, tmp_path)
    assert p.returncode == -signal.SIGTERM
    assert procs.records(tmp_path) == []


def test_finish_stops_the_whole_process_group(tmp_path: Path) -> None:
    p = procs.spawn(["sh", "-c", "sleep 300 & echo $! > gc; wait"], tmp_path, "sh", cwd=tmp_path)
    while not (tmp_path / "gc").is_file() or not (tmp_path / "gc").read_text().endswith("\n"):
        time.sleep(0.02)
    grandchild = int((tmp_path / "gc").read_text())
    procs.finish(p, tmp_path, grace_s=2.0)
    assert wait_gone([grandchild], 5) == []


@pytest.mark.parametrize("mode", ["main", "thread"])
def test_sigkill_of_the_owner_stops_its_children_within_seconds(tmp_path: Path, cache: Path, mode: str) -> None:
    owner, pids = start_owner(tmp_path / "run", cache, mode)
    assert pids["reaper"] and alive(pids["reaper"])
    owner.kill()
    owner.wait()
    # main thread: PDEATHSIG kills the child at once, the reaper its group; thread: the reaper does both
    assert wait_gone([pids["child"], pids["grandchild"], pids["reaper"]], 10) == []
    assert procs.records(tmp_path / "run") == []


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_stop_signals_unwind_like_ctrl_c_with_128_plus_n(tmp_path: Path, cache: Path, sig: int, status: int) -> None:
    owner, pids = start_owner(tmp_path / "run", cache)
    owner.send_signal(sig)
    assert owner.wait(timeout=20) == status
    assert wait_gone([pids["child"], pids["grandchild"], pids["reaper"]], 10) == []


def test_a_second_signal_does_not_cut_the_teardown_short(tmp_path: Path, cache: Path) -> None:
    # The child ignores SIGTERM, so teardown waits its grace period; a second signal lands in it.
    run_dir = tmp_path / "run"
    script = OWNER.replace('"sleep 300 & echo', "\"trap '' TERM; sleep 300 & echo")
    run_dir.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(run_dir), "main"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PROVISION_CACHE": str(cache)},
    )
    assert owner.stdout is not None
    pids = json.loads(owner.stdout.readline())
    owner.send_signal(signal.SIGTERM)
    # Not a fixed sleep: with both pending before the owner ran a handler, Python would run SIGINT's
    # first (it takes pending signals in number order), and a loaded machine made that happen.
    assert owner.stdout.readline() == "teardown\n"
    owner.send_signal(signal.SIGINT)
    assert owner.wait(timeout=20) == 143
    assert wait_gone([pids["child"], pids["grandchild"]], 5) == []


def test_a_gpu_slot_stays_taken_while_a_child_holding_its_fd_lives(tmp_path: Path) -> None:
    slot = slots.try_acquire(1, tmp_path)
    assert slot is not None
    child = procs.spawn(["sleep", "300"], tmp_path, "qemu", keep_fds=(slot.fd,))
    slot.release()  # provision's own fd is gone: only the child keeps the lock
    try:
        assert slots.try_acquire(1, tmp_path) is None
    finally:
        procs.finish(child, tmp_path)
    again = slots.try_acquire(1, tmp_path)
    assert again is not None
    again.release()


def test_leftovers_of_a_dead_owner_are_found_and_stopped(tmp_path: Path, cache: Path) -> None:
    run_dir = cache / "runs" / "r1"
    owner, pids = start_owner(run_dir, cache, "thread")
    # Kill the reaper first, then the owner: the child lives on with a dead owner, as after a host crash
    # of the reaper, and only the next command's sweep can find it.
    os.kill(pids["reaper"], signal.SIGKILL)
    owner.kill()
    owner.wait()
    time.sleep(0.3)
    assert alive(pids["child"]) and alive(pids["grandchild"])
    found = procs.leftovers()
    assert [(d, r.pid) for d, r in found] == [(run_dir, pids["child"])]
    said: list[str] = []
    stopped = procs.clean_leftovers(said.append)
    assert [r.pid for r in stopped] == [pids["child"]]
    assert "leftover child" in said[0]
    assert wait_gone([pids["child"], pids["grandchild"]], 10) == []
    assert procs.records(run_dir) == [] and procs.leftovers() == []


def test_a_reused_pid_is_not_taken_for_a_recorded_process(tmp_path: Path) -> None:
    p = procs.spawn(["sleep", "30"], tmp_path, "sleeper")
    (rec,) = procs.records(tmp_path)
    stranger = procs.Record(rec.name, rec.pid, rec.pgid, rec.start + 1, rec.owner, rec.owner_start, rec.argv)
    try:
        assert not stranger.alive()
        procs.stop_records([stranger], grace_s=0.5)
        assert p.poll() is None  # a process that merely has the recorded pid is left alone
    finally:
        procs.finish(p, tmp_path)


def test_reading_records_survives_a_run_directory_pruned_meanwhile(tmp_path: Path) -> None:
    # Another job prunes finished run directories while this one looks for leftovers: the
    # records folder can vanish between being found and being listed.
    import dataclasses
    import shutil
    import threading

    run_dir = tmp_path / "run"
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            (run_dir / procs.RECORDS).mkdir(parents=True, exist_ok=True)
            shutil.rmtree(run_dir, ignore_errors=True)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert procs.records(run_dir) == []
    finally:
        stop.set()
        thread.join()
    rec = procs.Record("x", 1, 1, 1, 1, 1, ("true",))
    (run_dir / procs.RECORDS).mkdir(parents=True)
    (run_dir / procs.RECORDS / "1.json").write_text(json.dumps(dataclasses.asdict(rec)))
    (run_dir / procs.RECORDS / "1.json.tmp").write_text("{")
    assert procs.records(run_dir) == [rec]
