"""What callers hand a host, and what a run hands back: frozen values, each checked once where it is made.

A ``RunRequest`` is every guest run (`provision run`, shell, serve, the API, bench, perplexity); the
catalog's rules (E007, the route) hold from the moment one exists. ``RunIO`` is how a run reports
while it goes (output, cancel, the start of the VM); ``RunResult`` is what it ends with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from provision.adapters.podman_machine import DEFAULT_MACHINE
from provision.core import catalog, values
from provision.core.catalog import GPU_ROUTES, Stack
from provision.core.diagnostics import Check
from provision.core.errors import UnknownRoute
from provision.core.isolation import GuestLimits

# A served guest ends after 30 days at the latest; no run is longer.
LONGEST_RUN_S = 30 * 24 * 3600.0
MAX_CPUS = 256  # a sanity bound for launch plans; a real launch is also held to this host's CPU count


@dataclass(frozen=True)
class Forward:
    """One guest TCP port published on a host address (`provision serve`)."""

    host: str
    port: int
    guest_port: int

    def __post_init__(self) -> None:
        values.int_range(self.port, "--port", 0, 65535)
        values.int_range(self.guest_port, "guest port", 1, 65535)


@dataclass(frozen=True)
class RunRequest:
    """One guest command, checked values only: E007 and the route rule hold once it exists."""

    stack: Stack
    gpu: bool
    command: tuple[str, ...]
    limits: GuestLimits = field(default_factory=GuestLimits)
    model_path: Path | None = None
    model_name: str | None = None  # the file name in the guest (shell, serve)
    route: str | None = None
    timeout_s: float | None = None  # over limits.timeout_s; a shell with none given has no deadline
    forward: Forward | None = None  # serve: one published port
    terminal: str | None = None  # shell: a pty the guest's ttyS1 is
    slot_wait_s: float | None = None  # serve, the API: a bound on the wait for a GPU slot
    model_extras: tuple[tuple[str, Path], ...] = ()  # perplexity: files beside the model (name, host path)

    def __post_init__(self) -> None:
        catalog.check_gpu(self.stack, self.gpu)  # no silent CPU fallback
        catalog.check_route(self.stack, self.route)
        values.seconds(self.timeout_s, "--timeout", maximum=LONGEST_RUN_S)
        values.seconds(self.slot_wait_s, "--wait", maximum=LONGEST_RUN_S)

    @property
    def deadline_s(self) -> float | None:
        return self.timeout_s if self.timeout_s is not None else self.limits.timeout_s


@dataclass(frozen=True)
class RunIO:
    """How a running guest reports: its output (None: this process's), a cancel flag, and
    ``on_start(pid, run_dir)`` the moment the VM process exists; ``say`` gets progress lines."""

    out: BinaryIO | None = None
    err: BinaryIO | None = None
    cancel: threading.Event | None = None
    on_start: Callable[[int, Path], None] | None = None
    say: Callable[[str], None] | None = None


@dataclass(frozen=True)
class RunResult:
    exit_status: int
    run_dir: Path | None = None
    pid: int | None = None  # the VM process (Linux: QEMU)
    wall_s: float = 0.0
    accel: str | None = None


@dataclass(frozen=True)
class BenchRequest:
    stack: Stack
    model_path: Path
    label: str
    timeout_s: float
    out_dir: Path
    host_baseline: bool = True
    venus_stack: Stack | None = None  # APIR stacks: the Venus stack benched beside it


@dataclass(frozen=True)
class PerplexityRequest:
    """`provision perplexity`: ``resolve_model`` may download, so the host calls it after every check."""

    stack: Stack
    gpu: bool
    resolve_model: Callable[[], Path]
    label: str
    ctx: int
    chunks: int
    text: Path | None = None
    timeout_s: float = 900.0
    route: str | None = None

    def __post_init__(self) -> None:
        catalog.check_gpu(self.stack, self.gpu)
        catalog.check_route(self.stack, self.route)
        values.seconds(self.timeout_s, "--timeout")


@dataclass(frozen=True)
class ToolsRequest:
    """`provision host-tools`: make, check, pack or install what runs guests on a Linux host."""

    check: bool = False
    force: bool = False
    apir: bool = False
    virgl_src: Path | None = None
    bundle: Path | None = None  # pack the tools into this archive
    stacks: tuple[str, ...] = ("llama-linux",)
    minimal: bool = False
    guest: bool = True
    host_driver: bool = False
    install_from: Path | None = None  # install a bundle
    install_to: Path | None = None


@dataclass(frozen=True)
class LaunchRequest:
    """`provision launch`: the podman machine on the Venus or APIR route (macOS)."""

    route: str = "venus"
    machine: str = DEFAULT_MACHINE
    cpus: int | None = None
    memory_mib: int | None = None
    vram_mib: int | None = None
    apir_log_dir: str | None = None
    krun: Path | None = field(default=None, compare=False)  # the krun bundle's prefix (default: the Nix profile)

    def __post_init__(self) -> None:
        # Every value reaches the plan's shell lines or a file name: checked here, quoted there.
        if self.route not in GPU_ROUTES:
            raise UnknownRoute(f"route {self.route!r} is not one of {', '.join(GPU_ROUTES)}")
        values.machine_name(self.machine)
        values.int_range(self.cpus, "--cpus", 1, MAX_CPUS, why="vCPUs of one krunkit VM")
        values.int_range(self.memory_mib, "--memory", 1, 1 << 20)
        values.int_range(self.vram_mib, "--vram", 0, 1 << 20)
        values.plain_path(self.apir_log_dir, "--apir-log-dir", absolute=True)


@dataclass(frozen=True)
class Prepared:
    """What preparing the host did or found: data for ``--json``, text lines, checks, warnings."""

    data: Mapping[str, Any]
    lines: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    warnings: tuple[str, ...] = ()
