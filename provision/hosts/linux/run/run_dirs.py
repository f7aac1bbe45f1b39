"""Run directories under the cache's `runs/`: one per guest run (its job disk, logs, process
records), made before the guest waits for its GPU slot and kept after it ends for a look at
what happened; only the newest KEEP_RUNS finished ones stay."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from provision.adapters import runner
from provision.core.paths import cache_dir

KEEP_RUNS = 20
FINISHED = "finished"  # written into a run directory once its processes are stopped
ABANDONED_AFTER_S = 24 * 3600


def new() -> Path:
    """A fresh run directory (time, pid and a nanosecond count: unique across threads and processes)."""
    base = cache_dir("runs")
    d = base / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    d.mkdir()
    return d


def prune() -> None:
    """Keep the newest KEEP_RUNS finished runs.

    Other jobs prune at the same moment (API threads, other `provision` processes), so a run may
    vanish between listing and looking at it. A run without its FINISHED mark may be a job still
    waiting for a GPU slot (its job disk is already there): it stays, unless nothing of it is
    recorded as running and it is older than a day (a provision killed before it could finish).
    """
    base = cache_dir("runs")
    now = time.time()
    done: list[tuple[float, Path]] = []
    for run in base.iterdir():
        try:
            mtime = run.stat().st_mtime
            if (run / FINISHED).exists():
                done.append((mtime, run))
            elif now - mtime > ABANDONED_AFTER_S and not runner.records(run):
                shutil.rmtree(run, ignore_errors=True)
        except OSError:
            continue  # pruned by another job just now
    done.sort()
    for _, old in done[: max(len(done) - KEEP_RUNS, 0)]:
        shutil.rmtree(old, ignore_errors=True)


def finished(run_dir: Path) -> None:
    """Mark a run whose processes are all stopped: from now on pruning may take it."""
    with contextlib.suppress(OSError):  # a full disk must not hide why the run ended
        (run_dir / FINISHED).touch()
