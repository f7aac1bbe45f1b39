"""Linux host backend: boots the stack's image as a QEMU VM and runs one command in it.

A run is a plan (runplan.py: a frozen RunPlan from a pure function, what `provision run
--dry-run` prints) carried out by ``carry_out``; the watch loop is watch.py.

GPU guests get ``virtio-gpu-gl-pci`` with Venus: the guest's Mesa venus driver talks to
virglrenderer's render server on the host, which runs the host's Vulkan driver (a real
GPU, or lavapipe). Order of a run, each step failing with its own error code:
catalog rules (E007) -> host tools (E020) -> disks -> GPU slot (E022) -> QEMU (its GL display:
a render node, or SDL's offscreen driver over EGL, display.py) -> the guest's exit status, or E021
on the deadline. QEMU and its render server are always stopped and reaped on every path out;
started by adapters/procs.py, they also die with a killed provision.
"""

from __future__ import annotations

import io
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from provision.adapters import qemu, runner
from provision.core import catalog
from provision.core import settings as settings_mod
from provision.core.catalog import Stack
from provision.core.errors import ProvisionError, VmFailed
from provision.core.isolation import DEFAULT_TIMEOUT_S, GuestLimits
from provision.core.log import say
from provision.core.paths import cache_dir
from provision.hosts.linux import accel as accel_mod
from provision.hosts.linux import bundle, companions, isolation, run_dirs, runplan, slots, watch
from provision.hosts.linux import disks as vmdisk
from provision.hosts.linux import display as gl_display
from provision.hosts.linux import tools as host_tools

IN_CHROOT = runplan.IN_CHROOT
job_script = runplan.job_script


@dataclass
class RunResult:
    exit_status: int
    run_dir: Path
    qemu_pid: int
    wall_s: float
    accel: str


@dataclass
class LinuxBackend:
    """Runs guests: checks the request, gathers the host's facts, plans (runplan.plan_run), carries the plan out.

    The fields are the caller's settings (serve, shell, the API, `provision run --memory/--cpus`);
    nothing here changes what a plan says once it is made.
    """

    name: str = "linux"
    log: Callable[[str], None] = field(default=lambda s: say("run")(f"provision: {s}"))
    # `provision run --memory/--cpus` (provision/core/isolation.py): where set, they replace the defaults.
    limits: GuestLimits = field(default_factory=GuestLimits)
    # provision serve / shell: a published port, a terminal for ttyS1, told QEMU's pid and the
    # run dir once it started, a bound wait for a GPU slot.
    forward: qemu.Forward | None = None
    terminal: str | None = None
    on_start: Callable[[int, Path], None] | None = None
    slot_wait_s: float | None = None

    # --- HostBackend --------------------------------------------------------------------

    def run(
        self,
        stack: Stack,
        gpu: bool,
        model_path: Path | None,
        command: Sequence[str],
        timeout: float | None,
        route: str | None,
    ) -> int:
        return self.execute(stack, gpu, model_path, command, timeout, route).exit_status

    # --- the whole run ------------------------------------------------------------------

    def _request(
        self, stack: Stack, gpu: bool, model_path: Path | None, command: Sequence[str], timeout: float | None,
        route: str | None, model_name: str | None,
    ) -> runplan.RunRequest:
        catalog.check_gpu(stack, gpu)
        catalog.check_route(stack, route)
        if "linux" not in stack.hosts:
            raise VmFailed(f"stack {stack.name!r} is not made for Linux hosts (hosts: {', '.join(stack.hosts)})")
        if not command:
            raise VmFailed("no command given to run in the guest", fix="provision run STACK -- CMD ...")
        return runplan.RunRequest(
            stack=stack,
            gpu=gpu,
            command=tuple(command),
            timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
            guest_model=vmdisk.guest_model_name(model_path, model_name) if model_path else None,
            memory_mib=self.limits.memory_mib,
            cpus=self.limits.cpus,
            forward=self.forward,
            terminal=self.terminal,
            slot_wait_s=self.slot_wait_s,
        )

    def plan_run(
        self, stack: Stack, gpu: bool, model_path: Path | None, command: Sequence[str], timeout: float | None,
        route: str | None = None, *, model_name: str | None = None,
    ) -> runplan.RunPlan:
        """The plan `provision run --dry-run` prints: builds no image and no disk, starts nothing.
        A disk not made yet shows as the path it will have."""
        req = self._request(stack, gpu, model_path, command, timeout, route, model_name)
        tools = _tools(stack, gpu)
        root = bundle.root_disk_for(tools, stack) or _planned_root_disk(stack)
        model_disk = cache_dir("model-disks") / "(made at run time).img" if model_path else None
        return runplan.plan_run(req, _facts(tools, stack, gpu, root, cache_dir("runs") / "(new at run time)",
                                            model_disk))

    def execute(
        self,
        stack: Stack,
        gpu: bool,
        model_path: Path | None,
        command: Sequence[str],
        timeout: float | None,
        route: str | None = None,
        *,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        model_name: str | None = None,
        cancel: threading.Event | None = None,
        model_extras: Mapping[str, Path] | None = None,
    ) -> RunResult:
        req = self._request(stack, gpu, model_path, command, timeout, route, model_name)
        tools = _tools(stack, gpu)
        root = bundle.root_disk_for(tools, stack) or self.root_disk(stack)
        model_disk = (vmdisk.model_disk(model_path, req.guest_model, model_extras)
                      if model_path and req.guest_model else None)
        plan = runplan.plan_run(req, _facts(tools, stack, gpu, root, run_dirs.new(), model_disk))
        return carry_out(plan, stdout or sys.stdout.buffer, stderr or sys.stderr.buffer, log=self.log,
                         on_start=self.on_start, cancel=cancel)

    def root_disk(self, stack: Stack) -> vmdisk.RootDisk:
        ref, image_id = image_for(stack)
        return vmdisk.root_disk(ref, image_id)


def _tools(stack: Stack, gpu: bool) -> host_tools.HostTools:
    if stack.route == "apir" and gpu:
        from provision.hosts.linux import apir_host

        apir_host.require(host_tools.locate())  # E020 naming `host-tools --apir`, before any VM
    return host_tools.require(gpu=gpu)


def _facts(
    tools: host_tools.HostTools, stack: Stack, gpu: bool, root: vmdisk.RootDisk, run_dir: Path,
    model_disk: Path | None, settings: settings_mod.Settings | None = None,
) -> runplan.HostFacts:
    """What the host has for this run. The route's QEMU environment is per run, never kept: one
    backend runs an APIR guest and then a Venus one (`provision bench` compares them), and
    VIRGL_ROUTE_VENUS_TO_APIR left over would take Venus away."""
    route_env: dict[str, str] = {}
    apir = stack.route == "apir" and gpu
    if apir:
        from provision.hosts.linux import apir_host

        # APIR: QEMU loads our virglrenderer, which loads the host ggml (Venus capset re-routed).
        route_env = apir_host.require(tools).qemu_env()
    return runplan.HostFacts(
        tools=tools,
        accel=accel_mod.host_accelerator(),
        render_node=_has_render_node(),
        root=root,
        run_dir=run_dir,
        model_disk=model_disk,
        route_env=route_env,
        watch_workers=apir,
        guest_debug=(settings or settings_mod.current()).typed.guest_debug,
    )


def _planned_root_disk(stack: Stack) -> vmdisk.RootDisk:
    """Where the stack's VM disk is (already made) or will be (named by its image), for a dry run."""
    from provision.core import pins as pins_mod
    from provision.images import build as images

    ref = images.default_tag(images.render_stack(stack, pins_mod.default()))
    where = cache_dir("vm-disks") / f"(made at run time from {ref})"
    return vmdisk.RootDisk(where / "root.img", where / "vmlinuz", where / "initrd.img", "")


def carry_out(
    plan: runplan.RunPlan,
    out: BinaryIO,
    err: BinaryIO,
    *,
    log: Callable[[str], None],
    on_start: Callable[[int, Path], None] | None = None,
    cancel: threading.Event | None = None,
) -> RunResult:
    """The one function that runs a plan: job disk, GPU slot, the user drop, QEMU, the watch.

    QEMU and the render server it started are stopped and reaped on every way out; the GPU slot is released.
    """
    run_dir = plan.run_dir
    vmdisk.write_job_disk(plan.job, run_dir / "job.img")
    deadline = time.monotonic() + plan.timeout_s
    runner.clean_leftovers(log)  # a killed provision's guests must not hold slots
    slot_deadline = deadline if plan.slot_wait_s is None else min(deadline, time.monotonic() + plan.slot_wait_s)
    slot = slots.acquire(slot_deadline, cancel=cancel) if plan.gpu else None
    try:
        fds = (slot.fd,) if slot else ()  # QEMU holds the slot's lock too: it drops when the guest is gone
        try:
            return _boot(plan, deadline, out, err, keep_fds=fds, log=log, on_start=on_start, cancel=cancel)
        except watch.InitNeverStarted as hang:
            # A rare TCG hang before the kernel printed a line (seen twice in this project's CI runs).
            # Nothing of the job ran and every disk is read-only, so booting again is safe.
            try:
                kept = _set_aside(run_dir, "boot-1")
            except OSError as exc:  # e.g. a full disk: a second boot would overwrite the only evidence
                raise VmFailed(f"{hang}; its logs could not be set aside for a second boot: {exc}",
                               fix=f"free space under {run_dir.parent} and run it again; the logs are in "
                               f"{run_dir}") from None
            log(f"{hang}; booting it once more (the first boot's logs: {kept})")
        try:
            return _boot(plan, deadline, out, err, keep_fds=fds, log=log, on_start=on_start, cancel=cancel)
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
    plan: runplan.RunPlan,
    deadline: float,
    out: BinaryIO,
    err: BinaryIO,
    *,
    keep_fds: tuple[int, ...],
    log: Callable[[str], None],
    on_start: Callable[[int, Path], None] | None,
    cancel: threading.Event | None,
) -> RunResult:
    run_dir, tools, accel, display = plan.run_dir, plan.tools, plan.accel, plan.display
    chroot, user = isolation.drop(tools.root, plan.chroot(), run_dir, accel=accel, gpu=plan.gpu,
                                  terminal=plan.spec.terminal)
    argv = plan.argv()
    (run_dir / "qemu.argv").write_text(shlex.join(argv) + "\n")
    env = {"HOME": user.home if user else "/root", **dict(plan.env)}
    proc: runner.Child | None = None
    started = time.monotonic()
    try:
        if display == "sdl":  # no X server: SDL's offscreen driver makes QEMU's GL context over EGL
            env.update(gl_display.run_env(tools.root if chroot else Path("/")))
        full = chroot.argv(argv, env) if chroot else tools.wrap(argv)
        with (run_dir / "qemu.log").open("wb") as qlog:
            proc = runner.start(
                full,
                "qemu",
                run_dir=run_dir,
                keep_fds=keep_fds,
                resolve=False,
                stdin=runner.DEVNULL,
                stdout=qlog,
                stderr=runner.STDOUT,
                env=None if chroot else {**os.environ, **env},
            )
        log(
            f"qemu pid={proc.pid} accel={accel} gpu={'venus' if plan.gpu else 'none'} display={display} run={run_dir}"
            + isolation.log_fields(user)
        )
        if on_start is not None:
            on_start(proc.pid, run_dir)
        beside = companions.Companions(proc.pid, run_dir)
        status = watch.watch(proc, run_dir, deadline, out, err, watch_workers=plan.watch_workers, beside=beside,
                             cancel=cancel)
        wall = time.monotonic() - started
        return RunResult(status, run_dir, proc.pid, wall, accel)
    finally:
        if proc is not None:
            proc.finish(grace_s=3.0)
        runner.stop_run(run_dir)  # the render server QEMU started (a process group of its own)
        run_dirs.finished(run_dir)
        run_dirs.prune()


def _has_render_node() -> bool:
    return any(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else False


def image_for(stack: Stack) -> tuple[str, str]:
    """(image ref, image id) of the stack's image: the one already built for these pins, else a build."""
    from provision.adapters import podman
    from provision.core import pins as pins_mod
    from provision.images import build as images

    ref = images.default_tag(images.render_stack(stack, pins_mod.default()))
    if podman.exists(ref):
        return ref, str(podman.inspect(ref)["Id"])
    built = images.build(stack.name)
    return built.ref, built.image_id


def capture_run(
    backend: LinuxBackend,
    stack: Stack,
    gpu: bool,
    model: Path | None,
    command: Sequence[str],
    timeout: float,
    model_name: str | None = None,
    model_extras: Mapping[str, Path] | None = None,
) -> tuple[RunResult, str, str]:
    """Run and also return the command's stdout and stderr as text."""
    out, err = io.BytesIO(), io.BytesIO()
    res = backend.execute(stack, gpu, model, command, timeout, stdout=out, stderr=err, model_name=model_name,
                          model_extras=model_extras)
    return res, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def backend() -> LinuxBackend:
    return LinuxBackend()


__all__ = ["LinuxBackend", "RunResult", "backend", "job_script", "ProvisionError"]
