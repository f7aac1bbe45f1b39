"""A Linux run as data: ``plan_run`` turns what was asked and what the host has into a frozen RunPlan.

Pure: every fact it needs (the host tools, the accelerator, the disks, the run directory,
the route's QEMU environment) is gathered first and passed in, so the plan is what the run
will do, and `provision run --dry-run` prints it without starting anything. backend.py's
``execute`` carries a plan out; nothing on the backend changes what a plan says.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provision.adapters import qemu
from provision.adapters.chroot import Chroot
from provision.core.catalog import Stack
from provision.core.isolation import sandbox_option
from provision.hosts.linux import disks as vmdisk
from provision.hosts.linux.tools import HostTools

# Where the run's files appear inside the host-tools chroot.
IN_CHROOT = {"run": "/mnt/krun/run", "vm": "/mnt/krun/vm", "model": "/mnt/krun/model"}
MEMORY_MIB, GPU_MEMORY_MIB, CPUS = 2048, 4096, 2


@dataclass(frozen=True)
class RunRequest:
    """What the caller asked for (already validated: catalog rules, limits, the model)."""

    stack: Stack
    gpu: bool
    command: tuple[str, ...]
    timeout_s: float
    guest_model: str | None = None  # the file name the guest sees under /models
    memory_mib: int | None = None
    cpus: int | None = None
    forward: qemu.Forward | None = None  # provision serve: one published port
    terminal: str | None = None  # provision shell: a pty for ttyS1
    slot_wait_s: float | None = None  # a bound on the wait for a GPU slot (serve, the API)


@dataclass(frozen=True)
class HostFacts:
    """What the host has for this run, found before planning."""

    tools: HostTools
    accel: str  # accel.for_run(): the setting accel, else what the CPU supports
    render_node: bool  # a /dev/dri render node: QEMU renders headless on it, else on SDL
    root: vmdisk.RootDisk
    run_dir: Path
    model_disk: Path | None = None
    route_env: Mapping[str, str] = field(default_factory=dict)  # APIR: our virglrenderer and the host ggml
    watch_workers: bool = False  # APIR: a dead render worker leaves the guest spinning
    guest_debug: bool = False  # the setting guest_debug = 1: the kernel's boot messages in console.log


@dataclass(frozen=True)
class RunPlan:
    stack: str
    route: str
    gpu: bool
    accel: str
    display: str
    tools: HostTools
    run_dir: Path
    binds: tuple[tuple[Path, str], ...]  # host dir -> path in the tools chroot (empty: no chroot)
    spec: qemu.VmSpec
    env: tuple[tuple[str, str], ...]  # QEMU's environment (HOME is the user's, added at the drop)
    job: str  # the script the guest's init runs
    watch_workers: bool
    timeout_s: float
    slot_wait_s: float | None

    def argv(self) -> list[str]:
        return qemu.argv(self.spec)

    def chroot(self) -> Chroot | None:
        return self.tools.chroot().with_binds(dict(self.binds)) if self.tools.is_chroot else None

    def as_dict(self) -> dict[str, object]:
        return {
            "stack": self.stack,
            "route": self.route,
            "gpu": self.gpu,
            "accel": self.accel,
            "display": self.display,
            "tools": self.tools.as_dict(),
            "run_dir": str(self.run_dir),
            "binds": {str(src): dst for src, dst in self.binds},
            "qemu_argv": self.argv(),
            "qemu_env": dict(self.env),
            "job": self.job,
            "watch_workers": self.watch_workers,
            "timeout_s": self.timeout_s,
            "gpu_slot": self.gpu,
            "slot_wait_s": self.slot_wait_s,
        }

    def shell(self) -> str:
        """The plan as a person reads it: QEMU's environment and command line, then the job."""
        lines = [f"# provision run {self.stack}: route {self.route}, accel {self.accel}, display {self.display}",
                 f"# tools {self.tools.root} ({self.tools.source}); run dir {self.run_dir}"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env]
        lines.append(shlex.join(self.argv()))
        lines += ["# job:"] + [f"#   {line}" for line in self.job.splitlines()]
        return "\n".join(lines) + "\n"


def job_script(stack: Stack, command: Sequence[str], model_name: str | None, gpu: bool) -> str:
    """The shell script the guest init runs: the stack's guest env, then the command."""
    env = dict(stack.guest_env)
    env["KRUN_GPU"] = "1" if gpu else "0"
    if model_name:
        env["MODEL"] = f"{vmdisk.MODEL_MOUNT}/{model_name}"
    lines = ["# written by provision run"] + [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"


def plan_run(req: RunRequest, host: HostFacts) -> RunPlan:
    run_dir, root = host.run_dir, host.root
    binds: dict[Path, str] = {}
    if host.tools.is_chroot:
        binds = {run_dir: IN_CHROOT["run"], root.directory: IN_CHROOT["vm"]}
        if host.model_disk:
            binds[host.model_disk.parent] = IN_CHROOT["model"]
    chroot = host.tools.chroot().with_binds(binds) if host.tools.is_chroot else None

    def where(p: Path) -> str:
        return chroot.inside(p) if chroot else str(p)

    drives = [qemu.Drive(where(run_dir / "job.img"), "krun-job")]
    if host.model_disk:
        drives.append(qemu.Drive(where(host.model_disk), "krun-model"))
    gpu = req.gpu
    display = "egl-headless" if gpu and host.render_node else ("sdl" if gpu else "none")
    spec = qemu.VmSpec(
        kernel=where(root.kernel),
        initrd=where(root.initrd),
        root=qemu.Drive(where(root.disk), "krun-root"),
        drives=tuple(drives),
        console_log=where(run_dir / "console.log"),
        stdout_log=where(run_dir / "stdout.log"),
        stderr_log=where(run_dir / "stderr.log"),
        accel=host.accel,
        memory_mib=req.memory_mib or (GPU_MEMORY_MIB if gpu else MEMORY_MIB),
        cpus=req.cpus or CPUS,
        gpu=gpu,
        hostmem_mib=req.stack.gpu_vram_mib or 2048,
        display=display,
        quiet=not host.guest_debug,
        sandbox=sandbox_option(gpu),
        forward=req.forward,
        terminal=req.terminal,
    )
    env = {"XDG_RUNTIME_DIR": "/tmp", **host.route_env}
    return RunPlan(
        stack=req.stack.name,
        route=req.stack.route if gpu else "cpu",
        gpu=gpu,
        accel=host.accel,
        display=display,
        tools=host.tools,
        run_dir=run_dir,
        binds=tuple(binds.items()),
        spec=spec,
        env=tuple(sorted(env.items())),
        job=job_script(req.stack, req.command, req.guest_model, gpu),
        watch_workers=host.watch_workers,
        timeout_s=req.timeout_s,
        slot_wait_s=req.slot_wait_s,
    )
