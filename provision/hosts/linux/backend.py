"""Linux host backend: boots the stack's image as a QEMU VM and runs one command in it.

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
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from provision.adapters import procs, qemu
from provision.adapters.chroot import Chroot
from provision.core import catalog
from provision.core.catalog import Stack
from provision.core.errors import ProvisionError, RunCancelled, RunTimeout, UnknownRoute, VmFailed
from provision.core.isolation import DEFAULT_TIMEOUT_S, GuestLimits, sandbox_option
from provision.hosts.linux import accel as accel_mod
from provision.hosts.linux import bundle, companions, isolation, logs, run_dirs, slots, watchdog
from provision.hosts.linux import disks as vmdisk
from provision.hosts.linux import display as gl_display
from provision.hosts.linux import tools as host_tools

EXIT_MARKER = re.compile(rb"KRUN-EXIT=(\d+)")
# Where the run's files appear inside the host-tools chroot.
IN_CHROOT = {"run": "/mnt/krun/run", "vm": "/mnt/krun/vm", "model": "/mnt/krun/model"}


@dataclass
class RunResult:
    exit_status: int
    run_dir: Path
    qemu_pid: int
    wall_s: float
    accel: str


@dataclass
class LinuxBackend:
    name: str = "linux"
    memory_mib: int = 2048
    gpu_memory_mib: int = 4096
    cpus: int = 2
    log: Callable[[str], None] = field(default=lambda s: print(f"provision: {s}", file=sys.stderr, flush=True))
    # Routes this backend can serve with stock QEMU + virglrenderer. A route that needs more on
    # the host (APIR: its own virglrenderer build) widens `routes` and sets the hooks below.
    routes: tuple[str, ...] = ("venus", "cpu", "apir")
    qemu_env: dict[str, str] = field(default_factory=dict)  # extra environment for QEMU
    extra_binds: dict[Path, str] = field(default_factory=dict)  # host dir -> path in the tools chroot
    # APIR: a dead host render worker leaves the guest spinning, so watch for it (watchdog.py).
    watch_workers: bool = False
    # `provision run --memory/--cpus` (provision/core/isolation.py): where set, they replace the defaults above.
    limits: GuestLimits = field(default_factory=GuestLimits)
    # provision serve / shell (provision/serve.py, provision/shell.py): a published port, a
    # terminal for ttyS1, a hook told QEMU's pid and the run dir, a bound wait for a GPU slot.
    forward: qemu.Forward | None = None
    terminal: str | None = None
    on_start: Callable[[int, Path], None] | None = None
    slot_wait_s: float | None = None

    def _route_env(self, tools: host_tools.HostTools, stack: Stack, gpu: bool) -> tuple[dict[str, str], bool]:
        """QEMU's environment for this run and whether to watch render workers. Per run, never
        stored on the backend: one backend runs an APIR guest and then a Venus one (`provision
        bench` compares them), and VIRGL_ROUTE_VENUS_TO_APIR left over would take Venus away."""
        if not (stack.route == "apir" and gpu):
            return dict(self.qemu_env), self.watch_workers
        from provision.apir import host as apir_host

        # APIR: QEMU loads our virglrenderer, which loads the host ggml (Venus capset re-routed).
        return {**self.qemu_env, **apir_host.require(tools).qemu_env()}, True

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
    ) -> RunResult:
        catalog.check_gpu(stack, gpu)
        catalog.check_route(stack, route)
        if stack.route not in self.routes:
            raise UnknownRoute(
                f"stack {stack.name!r} uses route {stack.route!r}; this Linux backend runs {', '.join(self.routes)}",
                fix="the APIR route needs the APIR virglrenderer on the host (provision/apir/route.py)",
            )
        if "linux" not in stack.hosts:
            raise VmFailed(f"stack {stack.name!r} is not made for Linux hosts (hosts: {', '.join(stack.hosts)})")
        if not command:
            raise VmFailed("no command given to run in the guest", fix="provision run STACK -- CMD ...")
        if stack.route == "apir" and gpu:
            from provision.apir import host as apir_host

            apir_host.require(host_tools.locate())  # E020 naming `host-tools --apir`, before any VM
        tools = host_tools.require(gpu=gpu)
        route_env, watch_workers = self._route_env(tools, stack, gpu)
        root = bundle.root_disk_for(tools, stack) or self.root_disk(stack)
        guest_model = vmdisk.guest_model_name(model_path, model_name) if model_path else None
        model_disk = vmdisk.model_disk(model_path, guest_model) if model_path and guest_model else None
        run_dir = run_dirs.new()
        job = job_script(stack, command, guest_model, gpu)
        vmdisk.write_job_disk(job, run_dir / "job.img")
        deadline = time.monotonic() + (timeout if timeout is not None else DEFAULT_TIMEOUT_S)
        out = stdout or sys.stdout.buffer
        err = stderr or sys.stderr.buffer
        procs.clean_leftovers(self.log)  # a killed provision's guests must not hold slots
        slot_deadline = deadline if self.slot_wait_s is None else min(deadline, time.monotonic() + self.slot_wait_s)
        slot = slots.acquire(slot_deadline, cancel=cancel) if gpu else None
        try:
            fds = (slot.fd,) if slot else ()  # QEMU holds the slot's lock too: it drops when the guest is gone
            return self._boot(tools, stack, gpu, root, model_disk, run_dir, deadline, out, err, keep_fds=fds,
                              cancel=cancel, route_env=route_env, watch_workers=watch_workers)
        finally:
            if slot is not None:
                slot.release()

    def root_disk(self, stack: Stack) -> vmdisk.RootDisk:
        ref, image_id = image_for(stack)
        return vmdisk.root_disk(ref, image_id)

    def _boot(
        self,
        tools: host_tools.HostTools,
        stack: Stack,
        gpu: bool,
        root: vmdisk.RootDisk,
        model_disk: Path | None,
        run_dir: Path,
        deadline: float,
        out: BinaryIO,
        err: BinaryIO,
        keep_fds: tuple[int, ...] = (),
        cancel: threading.Event | None = None,
        route_env: dict[str, str] | None = None,
        watch_workers: bool = False,
    ) -> RunResult:
        chroot: Chroot | None = None
        if tools.is_chroot:
            binds = {run_dir: IN_CHROOT["run"], root.directory: IN_CHROOT["vm"]}
            if model_disk:
                binds[model_disk.parent] = IN_CHROOT["model"]
            binds.update(self.extra_binds)
            chroot = tools.chroot().with_binds(binds)

        def where(p: Path) -> str:
            return chroot.inside(p) if chroot else str(p)

        drives = [qemu.Drive(where(run_dir / "job.img"), "krun-job")]
        if model_disk:
            drives.append(qemu.Drive(where(model_disk), "krun-model"))
        display = "egl-headless" if gpu and _has_render_node() else ("sdl" if gpu else "none")
        accel = accel_mod.host_accelerator()
        chroot, user = isolation.drop(tools.root, chroot, run_dir, accel=accel, gpu=gpu, terminal=self.terminal)
        spec = qemu.VmSpec(
            kernel=where(root.kernel),
            initrd=where(root.initrd),
            root=qemu.Drive(where(root.disk), "krun-root"),
            drives=tuple(drives),
            console_log=where(run_dir / "console.log"),
            stdout_log=where(run_dir / "stdout.log"),
            stderr_log=where(run_dir / "stderr.log"),
            accel=accel,
            memory_mib=self.limits.memory_mib or (self.gpu_memory_mib if gpu else self.memory_mib),
            cpus=self.limits.cpus or self.cpus,
            gpu=gpu,
            hostmem_mib=stack.gpu_vram_mib or 2048,
            display=display,
            quiet=os.environ.get("PROVISION_GUEST_DEBUG") != "1",
            sandbox=sandbox_option(gpu),
            forward=self.forward,
            terminal=self.terminal,
        )
        argv = qemu.argv(spec)
        (run_dir / "qemu.argv").write_text(shlex.join(argv) + "\n")
        env = {"HOME": user.home if user else "/root", "XDG_RUNTIME_DIR": "/tmp", **(route_env or {})}
        proc: subprocess.Popen[bytes] | None = None
        started = time.monotonic()
        try:
            if display == "sdl":
                env.update(gl_display.run_env(tools.root if chroot else Path("/")))
            full = chroot.argv(argv, env) if chroot else tools.wrap(argv)
            with (run_dir / "qemu.log").open("wb") as qlog:
                proc = procs.spawn(
                    full,
                    run_dir,
                    "qemu",
                    keep_fds=keep_fds,
                    stdin=subprocess.DEVNULL,
                    stdout=qlog,
                    stderr=subprocess.STDOUT,
                    env=None if chroot else {**os.environ, **env},
                )
            self.log(
                f"qemu pid={proc.pid} accel={accel} gpu={'venus' if gpu else 'none'} display={display} run={run_dir}"
                + isolation.log_fields(user)
            )
            if self.on_start is not None:
                self.on_start(proc.pid, run_dir)
            beside = companions.Companions(proc.pid, run_dir)
            status = _watch(proc, run_dir, deadline, out, err, watch_workers=watch_workers, beside=beside,
                            cancel=cancel)
            wall = time.monotonic() - started
            return RunResult(status, run_dir, proc.pid, wall, accel)
        finally:
            if proc is not None:
                procs.finish(proc, run_dir, grace_s=3.0)
            procs.stop(run_dir)  # the render server QEMU started (a process group of its own)
            run_dirs.finished(run_dir)
            run_dirs.prune()


def _watch(
    proc: subprocess.Popen[bytes],
    run_dir: Path,
    deadline: float,
    out: BinaryIO,
    err: BinaryIO,
    *,
    watch_workers: bool = False,
    beside: companions.Companions | None = None,
    cancel: threading.Event | None = None,
) -> int:
    streams = [logs.Tail(run_dir / "stdout.log", out), logs.Tail(run_dir / "stderr.log", err)]
    console = run_dir / "console.log"
    status: int | None = None
    workers = watchdog.WorkerWatch(proc.pid) if watch_workers else None
    seen_lines = 0
    while True:
        progressed = any([s.pump() for s in streams])
        text = console.read_bytes() if console.exists() else b""
        m = EXIT_MARKER.search(text)
        if m:
            status = int(m.group(1))
            break
        if workers is not None:
            # Host aborts reach QEMU's log; guest-side ones its stderr. Either ends the run now.
            lines = (logs.read_text(run_dir / "qemu.log") + logs.read_text(run_dir / "stderr.log")).splitlines()
            for line in lines[seen_lines:]:
                death = watchdog.classify(line)
                if death is not None:
                    procs.stop_process(proc, grace_s=2.0)
                    raise death.error()
            seen_lines = len(lines)
            if progressed:
                workers.progress()
            death = workers.poll(time.monotonic())
            if death is not None:
                procs.stop_process(proc, grace_s=2.0)
                raise death.error()
        if proc.poll() is not None:
            break
        dead = beside.poll() if beside is not None else None
        if dead is not None:  # the caller stops QEMU and the rest at once
            raise VmFailed(f"{dead} while the guest ran; QEMU (pid {proc.pid}) was stopped", fix=f"see {run_dir}")
        cancelled = cancel is not None and cancel.is_set()  # another thread stops this guest
        if cancelled or time.monotonic() >= deadline:
            procs.stop_process(proc, grace_s=2.0)
            for s in streams:
                s.pump()
            if cancelled:
                raise RunCancelled(f"the run was cancelled; QEMU (pid {proc.pid}) was stopped (logs: {run_dir})")
            raise RunTimeout(
                f"the guest did not finish before the deadline; QEMU (pid {proc.pid}) was stopped (logs: {run_dir})"
            )
        time.sleep(0.2)
    # The guest powers off right after the marker; its last bytes are in the files once QEMU is gone.
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        procs.stop_process(proc, grace_s=2.0)
    for s in streams:
        s.pump()
    if status is None:
        raise VmFailed(
            f"QEMU exited ({proc.returncode}) before the guest reported an exit status: "
            f"{logs.tail(run_dir / 'qemu.log')} | console: {logs.tail(console)}",
            fix=f"see {run_dir}",
        )
    return status


def _has_render_node() -> bool:
    return any(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else False


def job_script(stack: Stack, command: Sequence[str], model_name: str | None, gpu: bool) -> str:
    """The shell script the guest init runs: the stack's guest env, then the command."""
    env = dict(stack.guest_env)
    env["KRUN_GPU"] = "1" if gpu else "0"
    if model_name:
        env["MODEL"] = f"{vmdisk.MODEL_MOUNT}/{model_name}"
    lines = ["# written by provision run"] + [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"


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
) -> tuple[RunResult, str, str]:
    """Run and also return the command's stdout and stderr as text."""
    out, err = io.BytesIO(), io.BytesIO()
    res = backend.execute(stack, gpu, model, command, timeout, stdout=out, stderr=err, model_name=model_name)
    return res, out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")


def backend() -> LinuxBackend:
    return LinuxBackend()


__all__ = ["LinuxBackend", "RunResult", "backend", "job_script", "ProvisionError"]
