"""Run directories: the newest finished ones are kept, a waiting one is never taken from under its
job, and jobs pruning at the same moment (API threads, other provision processes) do not trip
over each other (a 500 in CI came from exactly that)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from provision.hosts.linux.run import run_dirs


def make_run(base: Path, name: str, age_s: float, finished: bool) -> Path:
    run = base / name
    run.mkdir(parents=True)
    (run / "job.img").write_bytes(b"\0" * 512)
    if finished:
        (run / run_dirs.FINISHED).touch()
    stamp = time.time() - age_s
    os.utime(run, (stamp, stamp))
    return run


@pytest.fixture
def runs(empty_cache: Path) -> Path:
    return empty_cache / "runs"


def test_keeps_the_newest_finished_runs_and_a_run_still_waiting_for_its_slot(runs: Path) -> None:
    finished = [make_run(runs, f"f{i:02}", age_s=3600 - i, finished=True) for i in range(run_dirs.KEEP_RUNS + 5)]
    waiting = make_run(runs, "waiting", age_s=7200, finished=False)  # older than all, still in its slot queue
    abandoned = make_run(runs, "abandoned", age_s=2 * 86400, finished=False)  # its provision was killed

    run_dirs.prune()

    left = {p.name for p in runs.iterdir()}
    assert left == {p.name for p in finished[5:]} | {waiting.name}
    assert (waiting / "job.img").exists()
    assert not abandoned.exists()


def test_jobs_pruning_at_once_never_raise(runs: Path) -> None:
    for i in range(400):
        make_run(runs, f"r{i:03}", age_s=4000 - i, finished=True)
    errors: list[BaseException] = []
    go = threading.Barrier(6)

    def prune() -> None:
        go.wait()
        try:
            run_dirs.prune()
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever escaped
            errors.append(exc)

    threads = [threading.Thread(target=prune) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(list(runs.iterdir())) == run_dirs.KEEP_RUNS
