"""Linux guests: a RunRequest is planned (facts.py, runplan.py) and the plan carried out here.

GPU guests get ``virtio-gpu-gl-pci`` with Venus: the guest's Mesa venus driver talks to
virglrenderer's render server on the host, which runs the host's Vulkan driver (a real
GPU, or lavapipe). Order of a run, each step failing with its own error code:
catalog rules (E007, the request) -> host tools (E020) -> disks -> GPU slot (E022) -> QEMU (its GL
display: a render node, or SDL's offscreen driver over EGL, display.py) -> the guest's exit status,
or E021 on the deadline. ``execute`` starts exactly the plan's argv, environment, user and working
directory; QEMU and its render server are stopped and reaped on every path out; started by
the runner's owned process tree, they also die with a killed provision.
"""

from __future__ import annotations

import io as io_mod
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from provision.adapters import runner
from provision.core.errors import VmFailed
from provision.core.log import say as progress
from provision.hosts import RunIO, RunRequest, RunResult
from provision.hosts.linux.run import companions, facts, isolation, run_dirs, runplan, slots, watch
from provision.images import disks as vmdisk

PLAN_FILE = "plan.json"  # the plan a run carried out, beside its logs
_progress = progress("run")


def _said(text: str) -> None:
    _progress(f"provision: {text}")  # progress lines name their area themselves (core/log.py)


def plan(req: RunRequest, *, dry_run: bool = False) -> runplan.RunPlan:
    """The plan for ``req``; a dry run's writes nothing and fetches nothing."""
    return runplan.plan_run(req, facts.gather(req, dry_run=dry_run))


def run(req: RunRequest, io: RunIO | None = None) -> RunResult:
    return execute(plan(req), io or RunIO())


def run_captured(req: RunRequest) -> tuple[RunResult, str, str]:
    """Run ``req`` and also return the command's stdout and stderr as text (bench, perplexity)."""
    out, err = io_mod.BytesIO(), io_mod.BytesIO()
    res = run(req, RunIO(out=out, err=err))
    return res, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def execute(plan: runplan.RunPlan, io: RunIO) -> RunResult:
    """Run a plan: job disk, GPU slot, QEMU, the watch. QEMU and the render server it started are
    stopped and reaped on every way out; the GPU slot is released."""
    say = io.say or _said
    run_dir = plan.run_dir
    vmdisk.write_job_disk(plan.job, run_dir / "job.img")
    deadline = time.monotonic() + plan.timeout_s
    runner.clean_leftovers(say)  # a killed provision's guests must not hold slots
    slot_deadline = deadline if plan.slot_wait_s is None else min(deadline, time.monotonic() + plan.slot_wait_s)
    slot = slots.acquire(slot_deadline, cancel=io.cancel) if plan.gpu else None
    try:
        fds = (slot.fd,) if slot else ()  # QEMU holds the slot's lock too: it drops when the guest is gone
        try:
            return _boot(plan, deadline, io, keep_fds=fds, say=say)
        except watch.InitNeverStarted as hang:
            # A rare TCG hang before the kernel printed a line. Nothing of the job ran and every
            # disk is read-only, so booting again is safe.
            try:
                kept = _set_aside(run_dir, "boot-1")
            except OSError as exc:  # e.g. a full disk: a second boot would overwrite the only evidence
                raise VmFailed(f"{hang}; its logs could not be set aside for a second boot: {exc}",
                               fix=f"free space under {run_dir.parent} and run it again; the logs are in "
                               f"{run_dir}") from None
            say(f"{hang}; booting it once more (the first boot's logs: {kept})")
        try:
            return _boot(plan, deadline, io, keep_fds=fds, say=say)
        except watch.InitNeverStarted as again:
            raise VmFailed(f"{again}, and the same on the boot before (logs: {kept})",
                           fix=f"see {run_dir}/qemu.log and `provision doctor`; a host that hangs every "
                           "boot may lack what the accelerator needs") from None
    finally:
        if slot is not None:
            slot.release()


def _set_aside(run_dir: Path, name: str) -> Path:
    """Move a boot's logs into ``run_dir/name``, so the next boot's do not overwrite them."""
    kept = run_dir / name
    kept.mkdir()
    for log_name in ("console.log", "stdout.log", "stderr.log", "qemu.log", "qemu.argv"):
        if (run_dir / log_name).exists():
            (run_dir / log_name).rename(kept / log_name)
    (run_dir / run_dirs.FINISHED).unlink(missing_ok=True)  # the first boot's end marked the run finished
    return kept


def _boot(
    plan: runplan.RunPlan, deadline: float, io: RunIO, *, keep_fds: tuple[int, ...], say: Callable[[str], None]
) -> RunResult:
    run_dir = plan.run_dir
    isolation.hand_over([run_dir / name for name in runplan.QEMU_WRITES], plan.spec.terminal, plan.user)
    (run_dir / "qemu.argv").write_text(shlex.join(plan.argv) + "\n")
    _write_plan(plan)
    env = dict(plan.env)
    proc: runner.Child | None = None
    started = time.monotonic()
    try:
        with (run_dir / "qemu.log").open("wb") as qlog:
            proc = runner.start(
                plan.argv,
                "qemu",
                run_dir=run_dir,
                keep_fds=keep_fds,
                resolve=False,
                cwd=run_dir,
                stdin=runner.DEVNULL,
                stdout=qlog,
                stderr=runner.STDOUT,
                # In the chroot, env -i in argv sets QEMU's whole environment; the wrapper keeps provision's.
                env={**os.environ, **env} if plan.inherit_env else None,
            )
        say(f"qemu pid={proc.pid} accel={plan.accel} gpu={'venus' if plan.gpu else 'none'} display={plan.display} "
            f"run={run_dir}" + isolation.log_fields(plan.user))  # fmt: skip
        if io.on_start is not None:
            io.on_start(proc.pid, run_dir)
        beside = companions.Companions(proc.pid, run_dir)
        status = watch.watch(proc, run_dir, deadline, io.out or sys.stdout.buffer, io.err or sys.stderr.buffer,
                             watch_workers=plan.watch_workers, beside=beside, cancel=io.cancel)  # fmt: skip
        return RunResult(status, run_dir, proc.pid, time.monotonic() - started, plan.accel)
    finally:
        if proc is not None:
            proc.finish(grace_s=3.0)
        runner.stop_run(run_dir)  # the render server QEMU started (a process group of its own)
        run_dirs.finished(run_dir)
        run_dirs.prune()


def _write_plan(plan: runplan.RunPlan) -> None:
    """The plan beside the logs, whole (a reader never sees half of it)."""
    tmp = plan.run_dir / f".{PLAN_FILE}.tmp"
    tmp.write_text(json.dumps(plan.as_dict(), indent=1) + "\n")
    tmp.rename(plan.run_dir / PLAN_FILE)
