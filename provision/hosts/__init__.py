"""Hosts: everything that differs between macOS and Linux, behind one protocol and one registry.

A host package (``darwin``, ``linux``) has a ``host`` module exposing ``host() -> Host``; ``native()``
picks the one for this machine. This is the one place that looks at ``sys.platform``: the CLI asks
``hosts.native()`` and never the platform (the idea comes from cibuildwheel's ``platforms/``).
A host says what it cannot do with ``WrongPlatform`` (E033), so `provision bench` on a Mac is
"wrong platform", not a Linux error.

May import: core, adapters, bench, routes, serve.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol, runtime_checkable

from provision.core.errors import WrongPlatform
from provision.hosts.requests import (
    BenchRequest,
    Forward,
    LaunchRequest,
    PerplexityRequest,
    Prepared,
    RunIO,
    RunRequest,
    RunResult,
    ToolsRequest,
)

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.routes.choose import HostFacts
    from provision.serve.engine import Guest, ServeRequest

# platform key -> the module whose host() makes its Host
HOSTS: Mapping[str, str] = {"linux": f"{__name__}.linux.host", "darwin": f"{__name__}.darwin.host"}

__all__ = ["BenchRequest", "Forward", "Host", "LaunchRequest", "PerplexityRequest", "Prepared", "RunIO",
           "RunRequest", "RunResult", "ToolsRequest", "get", "native", "platform_key", "wrong_platform"]  # fmt: skip


@runtime_checkable
class Host(Protocol):
    name: str

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        """What ``run`` would do, as data: exactly what would start. Writes nothing, fetches nothing."""
        ...

    def run(self, req: RunRequest, io: RunIO | None = None) -> RunResult:
        """Run the command in a guest. E007 before anything starts, E021 on timeout."""
        ...

    def plan_serve(self, req: ServeRequest) -> Mapping[str, Any]:
        """What ``serve_guest`` would start, as data (`provision serve --dry-run`)."""
        ...

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        """The guest `provision serve` runs llama-server in (not started yet)."""
        ...

    def plan_shell(self, req: RunRequest) -> Mapping[str, Any]:
        """What ``shell`` would start, as data (`provision shell --dry-run`)."""
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

    def perplexity(self, req: PerplexityRequest) -> dict[str, Any]:
        """llama-perplexity in a guest, recorded in the bench history; the result as data."""
        ...

    def prepare(self, req: ToolsRequest | LaunchRequest, *, dry_run: bool = False) -> Prepared:
        """Make this host ready to run guests: the host tools on Linux, the podman machine on macOS."""
        ...

    def route_facts(self) -> HostFacts:
        """What this host has for the route choice (routes.choose), read from files only."""
        ...

    def gpu_slots(self) -> int:
        """How many GPU guests may run at once here."""
        ...


def platform_key(platform: str | None = None) -> str:
    """"linux" or "darwin" for this machine (or ``platform``); E033 for any other."""
    platform = platform or sys.platform
    if platform == "darwin":
        return "darwin"
    if platform.startswith("linux"):
        return "linux"
    raise WrongPlatform(f"no host for platform {platform!r}", fix="use macOS (Apple Silicon) or Linux")


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


