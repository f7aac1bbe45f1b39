"""Hosts: everything that differs between macOS and Linux, behind one protocol and one registry.

A host package (``darwin``, ``linux``) has a ``host`` module exposing ``host() -> Host``; ``native()``
picks the one for this machine. This is the one place that looks at ``sys.platform``: the CLI asks
``hosts.native()`` and never the platform (the idea comes from cibuildwheel's ``platforms/``).
A host says what it cannot do with ``WrongPlatform`` (E033), so `provision bench` on a Mac is
"wrong platform", not a Linux error.

May import: core, adapters, bench, serve.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from provision.core.catalog import Stack
from provision.core.errors import WrongPlatform
from provision.core.isolation import GuestLimits

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.serve.engine import Guest, ServeRequest

# platform key -> the module whose host() makes its Host
HOSTS: Mapping[str, str] = {"linux": f"{__name__}.linux.host", "darwin": f"{__name__}.darwin.host"}


@dataclass(frozen=True)
class RunRequest:
    """One guest command: what `provision run` (and shell) asked for, checked values only."""

    stack: Stack
    gpu: bool
    command: tuple[str, ...]
    limits: GuestLimits = field(default_factory=GuestLimits)
    model_path: Path | None = None
    model_name: str | None = None  # the file name in the guest (shell, serve)
    route: str | None = None
    timeout_s: float | None = None  # over limits.timeout_s; a shell with none given has no deadline

    @property
    def deadline_s(self) -> float | None:
        return self.timeout_s if self.timeout_s is not None else self.limits.timeout_s


@dataclass(frozen=True)
class BenchRequest:
    stack: Stack
    model_path: Path
    label: str
    timeout_s: float
    out_dir: Path
    host_baseline: bool = True
    venus_stack: Stack | None = None  # APIR stacks: the Venus stack benched beside it


@runtime_checkable
class Host(Protocol):
    name: str

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        """What ``run`` would do, as data (pure apart from reading what is installed)."""
        ...

    def run(self, req: RunRequest) -> int:
        """Run the command in a guest; its exit status. E007 before anything starts, E021 on timeout."""
        ...

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        """The guest `provision serve` runs llama-server in (not started yet)."""
        ...

    def shell(self, req: RunRequest) -> int:
        """An interactive shell in a guest, on this terminal; the shell's exit status."""
        ...

    def doctor_checks(self, ctx: DoctorContext) -> list[Check]:
        """This host's checks (its route, its isolation), as data."""
        ...

    def bench(self, req: BenchRequest) -> BenchRun:
        """llama-bench in guests (and on the host): the report `provision bench` prints."""
        ...


def platform_key(platform: str | None = None) -> str:
    """"linux" or "darwin" for this machine (or ``platform``); E033 for any other."""
    platform = platform or sys.platform
    if platform == "darwin":
        return "darwin"
    if platform.startswith("linux"):
        return "linux"
    raise WrongPlatform(f"no host for platform {platform!r}", fix="use macOS (Apple Silicon) or Linux")


def native_is(key: str) -> bool:
    """Whether this machine is the ``key`` host (a plan for another host may still be made here)."""
    return platform_key() == key


def get(key: str) -> Host:
    module = HOSTS[key]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name not in (module, module.rpartition(".")[0]):
            raise
        raise WrongPlatform(f"the {key} host is not part of this build", fix="install the full krun-gpu") from None
    host: Host = mod.host()
    return host


def native(platform: str | None = None) -> Host:
    """The host this machine is (or ``platform``'s)."""
    return get(platform_key(platform))


def wrong_platform(host: str, what: str, fix: str) -> WrongPlatform:
    return WrongPlatform(f"{what} is not available on the {host} host", fix=fix)


