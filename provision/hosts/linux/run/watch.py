"""The watch loop of one Linux run: copy the guest's output, find its exit status, end early on a death.

Every 0.2 s it reads what each file gained since the last look (logs.py: one offset per
file): the guest's stdout and stderr are copied to the caller's streams, the console is
searched for ``KRUN-EXIT=<n>``, and, where the route is watched (APIR), each new line of
QEMU's log and of the guest's stderr is classified on its own (a host GGML abort reaches
QEMU's log, a guest-side one its stderr) and the render workers are polled
(render_workers.WorkerWatch). The run also ends at once when a companion (the render server,
companions.py) exits, when another thread cancels it, at the deadline, or when the guest's init has
not said ``KRUN-INIT`` within BOOT_S (a guest that never booted is InitNeverStarted, not a long silence).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import BinaryIO

from provision.adapters import runner
from provision.core.errors import RunCancelled, RunTimeout, VmFailed
from provision.hosts.linux.run import companions, logs, render_workers

# The guest's init ends the line; once QEMU is gone, what the console holds is all there is.
EXIT_LINE = re.compile(rb"KRUN-EXIT=(\d+)\r?\n")
EXIT_MARKER = re.compile(rb"KRUN-EXIT=(\d+)")
# The guest's init says so first thing (data/guest/init); the kernel is quiet before it.
INIT_LINE = re.compile(rb"KRUN-INIT ")
# A guest reaches its init within seconds even under TCG on a loaded host, while a QEMU that hangs
# before the kernel's first line stays silent for good: a guest silent this long never gets to its
# init, so it is stopped (and booted once more, execute.py) rather than left to its deadline.
BOOT_S = 300.0
POLL_S = 0.2


class InitNeverStarted(Exception):
    """The guest said nothing on its console within the boot limit; QEMU is stopped.

    Not yet an error with a code: its init never ran, so nothing of the job happened and every
    disk is read-only; the run may boot it once more (execute.execute does), and only a
    second hang is E024.
    """

    def __init__(self, seconds: float, pid: int, run_dir: Path) -> None:
        super().__init__(f"the guest's init never started: nothing on its console {seconds:.0f} s after QEMU "
                         f"started; QEMU (pid {pid}) was stopped (logs: {run_dir})")
        self.seconds = seconds


def _fatal(lines: list[str]) -> render_workers.Death | None:
    for line in lines:
        death = render_workers.classify(line)
        if death is not None:
            return death
    return None


def watch(
    proc: runner.Process,
    run_dir: Path,
    deadline: float,
    out: BinaryIO,
    err: BinaryIO,
    *,
    watch_workers: bool = False,
    beside: companions.Companions | None = None,
    cancel: threading.Event | None = None,
    boot_s: float = BOOT_S,
) -> int:
    """The guest's exit status; raises the run's error (E021, E023, E026, VmFailed) or
    InitNeverStarted otherwise."""
    stdout, stderr = logs.Tail(run_dir / "stdout.log", out), logs.Tail(run_dir / "stderr.log", err)
    console = logs.Marker(run_dir / "console.log")
    qemu_log = logs.Lines(run_dir / "qemu.log")
    workers = render_workers.WorkerWatch(proc.pid) if watch_workers else None
    try:
        boot = (logs.Marker(run_dir / "console.log"), time.monotonic() + boot_s, boot_s)
        return _loop(proc, run_dir, deadline, stdout, stderr, console, qemu_log, workers, beside, cancel, boot)
    finally:
        if workers is not None:  # what the worker watch judged, beside the run's logs
            record = run_dir / "workers.json"
            tmp = record.with_name(".workers.json.partial")
            judged: dict[str, object] = {**workers.counts, "blind": workers.blind, "polls": workers.polls}
            judged["closed_contexts"] = workers.record
            tmp.write_text(json.dumps(judged, indent=2) + "\n")
            tmp.rename(record)


def _loop(
    proc: runner.Process,
    run_dir: Path,
    deadline: float,
    stdout: logs.Tail,
    stderr: logs.Tail,
    console: logs.Marker,
    qemu_log: logs.Lines,
    workers: render_workers.WorkerWatch | None,
    beside: companions.Companions | None,
    cancel: threading.Event | None,
    boot: tuple[logs.Marker, float, float] | None,
) -> int:
    status: int | None = None
    while True:
        stdout.pump()
        guest_lines = stderr.pump()
        m = console.search(EXIT_LINE)
        if m:
            status = int(m.group(1))
            break
        if workers is not None:
            death = _fatal(qemu_log.read()) or _fatal(guest_lines) or workers.poll(time.monotonic())
            if death is not None:
                runner.stop_process(proc, grace_s=2.0)
                raise death.error()
        if proc.poll() is not None:
            break
        if boot is not None:
            if boot[0].search(INIT_LINE):
                boot = None  # it booted: from here only the run's own deadline counts
            elif time.monotonic() >= boot[1]:
                runner.stop_process(proc, grace_s=2.0)
                raise InitNeverStarted(boot[2], proc.pid, run_dir)
        dead = beside.poll() if beside is not None else None
        if dead is not None:  # the caller stops QEMU and the rest at once
            raise VmFailed(f"{dead} while the guest ran; QEMU (pid {proc.pid}) was stopped", fix=f"see {run_dir}")
        cancelled = cancel is not None and cancel.is_set()  # another thread stops this guest
        if cancelled or time.monotonic() >= deadline:
            runner.stop_process(proc, grace_s=2.0)
            stdout.pump()
            stderr.pump()
            if cancelled:
                raise RunCancelled(f"the run was cancelled; QEMU (pid {proc.pid}) was stopped (logs: {run_dir})")
            raise RunTimeout(
                f"the guest did not finish before the deadline; QEMU (pid {proc.pid}) was stopped (logs: {run_dir})"
            )
        time.sleep(POLL_S)
    # The guest powers off right after the marker; its last bytes are in the files once QEMU is gone.
    try:
        proc.wait(timeout=15)
    except runner.TimeoutExpired:
        runner.stop_process(proc, grace_s=2.0)
    stdout.pump()
    stderr.pump()
    if status is None:
        m = console.search(EXIT_MARKER)
        status = int(m.group(1)) if m else None
    if status is None:
        raise VmFailed(
            f"QEMU exited ({proc.returncode}) before the guest reported an exit status: "
            f"{logs.tail(run_dir / 'qemu.log')} | console: {logs.tail(run_dir / 'console.log')}",
            fix=f"see {run_dir}",
        )
    return status
