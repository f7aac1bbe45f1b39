"""A Linux run as data: ``plan_run`` turns a request and what the host has into a frozen RunPlan.

Pure: every fact it needs (the host tools, the accelerator, the disks, the run directory, the
user QEMU runs as, the display's and the route's environment) is gathered first (facts.py) and
passed in. The plan holds the final command line provision starts (chroot wrapper and user drop
included), QEMU's whole environment (or what it adds to provision's), the user, the root and the
working directory: execute.py starts exactly that, and `provision run --dry-run` prints it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from provision.adapters import qemu
from provision.core.catalog import Stack
from provision.core.errors import VmFailed
from provision.core.isolation import DEFAULT_TIMEOUT_S, sandbox_option
from provision.hosts import RunRequest
from provision.hosts.linux.tools.guest_user import GuestUser
from provision.hosts.linux.tools.host_tools import HostTools
from provision.images import disks as vmdisk

# Where the run's files appear inside the host-tools chroot.
IN_CHROOT = {"run": "/mnt/krun/run", "vm": "/mnt/krun/vm", "model": "/mnt/krun/model"}
MEMORY_MIB, GPU_MEMORY_MIB, CPUS = 2048, 4096, 2
# The files QEMU itself opens for writing (its serial logs); everything else it opens read-only.
QEMU_WRITES = ("console.log", "stdout.log", "stderr.log")


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
    display_env: Mapping[str, str] = field(default_factory=dict)  # SDL's offscreen GL driver (no render node)
    watch_workers: bool = False  # APIR: a dead render worker leaves the guest spinning
    guest_debug: bool = False  # the setting guest_debug = 1: the kernel's boot messages in console.log
    user: GuestUser | None = None  # who QEMU runs as (a root provision with a chroot: krun-guest)


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
    argv: tuple[str, ...]  # what provision starts (the chroot wrapper and the user drop included)
    env: tuple[tuple[str, str], ...]  # QEMU's environment: all of it, or (inherit_env) what it adds
    inherit_env: bool  # no chroot: QEMU gets provision's environment with ``env`` over it
    user: GuestUser | None
    root: Path  # the root directory QEMU sees
    job: str  # the script the guest's init runs
    watch_workers: bool
    timeout_s: float
    slot_wait_s: float | None

    @property
    def qemu_argv(self) -> list[str]:
        """QEMU's own command line: what ``argv`` execs into once the wrapper is done."""
        return qemu.argv(self.spec)

    @property
    def cwd(self) -> Path:
        """QEMU's working directory as it sees it: the run's, or in the chroot its root (chroot changes
        there); provision starts the wrapper in the run directory either way."""
        return self.run_dir if self.inherit_env else Path("/")

    def as_dict(self) -> dict[str, object]:
        return {
            "stack": self.stack,
            "route": self.route,
            "gpu": self.gpu,
            "accel": self.accel,
            "display": self.display,
            "tools": self.tools.as_dict(),
            "run_dir": str(self.run_dir),
            "cwd": str(self.cwd),
            "root": str(self.root),
            "user": None if self.user is None else {"name": self.user.name, "uid": self.user.uid,
                                                    "gid": self.user.gid, "groups": list(self.user.groups)},
            "binds": {str(src): dst for src, dst in self.binds},
            "argv": list(self.argv),
            "env": dict(self.env),
            "inherit_env": self.inherit_env,
            "qemu_argv": self.qemu_argv,
            "job": self.job,
            "watch_workers": self.watch_workers,
            "timeout_s": self.timeout_s,
            "gpu_slot": self.gpu,
            "slot_wait_s": self.slot_wait_s,
        }  # fmt: skip

    def shell(self) -> str:
        """The plan as a person reads it: what starts, where, as whom, with which environment, then the job."""
        who = f"{self.user.name} ({self.user.uid})" if self.user else "provision's user"
        lines = [f"# provision run {self.stack}: route {self.route}, accel {self.accel}, display {self.display}",
                 f"# tools {self.tools.root} ({self.tools.source}); QEMU runs as {who} in root {self.root}",
                 f"cd {shlex.quote(str(self.run_dir))}"]  # fmt: skip
        if self.inherit_env:
            lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env]
        else:
            lines.append("# QEMU's whole environment is the env -i list below")
        lines.append(shlex.join(self.argv))
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


def guest_model(req: RunRequest) -> str | None:
    """The file name the guest sees under /models."""
    return vmdisk.guest_model_name(req.model_path, req.model_name) if req.model_path else None


def plan_run(req: RunRequest, host: HostFacts) -> RunPlan:
    if not req.command:
        raise VmFailed("no command given to run in the guest", fix="provision run STACK -- CMD ...")
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
    limits = req.limits
    spec = qemu.VmSpec(
        kernel=where(root.kernel),
        initrd=where(root.initrd),
        root=qemu.Drive(where(root.disk), "krun-root"),
        drives=tuple(drives),
        console_log=where(run_dir / "console.log"),
        stdout_log=where(run_dir / "stdout.log"),
        stderr_log=where(run_dir / "stderr.log"),
        accel=host.accel,
        memory_mib=limits.memory_mib or (GPU_MEMORY_MIB if gpu else MEMORY_MIB),
        cpus=limits.cpus or CPUS,
        gpu=gpu,
        hostmem_mib=req.stack.gpu_vram_mib or 2048,
        display=display,
        quiet=not host.guest_debug,
        sandbox=sandbox_option(gpu),
        forward=qemu.Forward(req.forward.host, req.forward.port, req.forward.guest_port) if req.forward else None,
        terminal=req.terminal,
    )
    user = host.user if chroot is not None else None  # the drop is the chroot step's: no chroot, no drop
    env = {"XDG_RUNTIME_DIR": "/tmp", **host.route_env, **(host.display_env if display == "sdl" else {}),
           "HOME": user.home if user else "/root"}  # fmt: skip
    program = qemu.argv(spec)
    if chroot is not None:
        dropped = chroot.as_user(user.uid, user.gid, user.groups) if user else chroot
        argv, env = dropped.argv(program, env), chroot.environment(env)
    else:
        argv = host.tools.wrap(program)
    timeout = req.deadline_s
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
        argv=tuple(argv),
        env=tuple(sorted(env.items())),
        inherit_env=chroot is None,
        user=user,
        root=host.tools.root.resolve() if chroot is not None else Path("/"),
        job=job_script(req.stack, req.command, guest_model(req), gpu),
        watch_workers=host.watch_workers,
        timeout_s=timeout if timeout is not None else DEFAULT_TIMEOUT_S,
        slot_wait_s=req.slot_wait_s,
    )
