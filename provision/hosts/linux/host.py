"""The Linux host behind the one Host protocol: QEMU + virglrenderer guests, shell, serve, doctor, bench.

Every guest is one RunRequest -> plan (run/execute.plan: facts, then runplan.plan_run) -> execute.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from provision.hosts import (
    BenchRequest,
    LaunchRequest,
    PerplexityRequest,
    Prepared,
    RunIO,
    RunRequest,
    RunResult,
    ToolsRequest,
    wrong_platform,
)

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.routes.choose import HostFacts
    from provision.serve.engine import Guest, ServeRequest


class LinuxHost:
    name = "linux"

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        """The frozen RunPlan as data, with ``shell``: what `provision run --dry-run` prints."""
        from provision.hosts.linux.run import execute

        plan = execute.plan(req, dry_run=True)
        model = str(req.model_path) if req.model_path else None  # the file the model disk will hold
        return {"host": self.name, **plan.as_dict(), "model": model, "limits": req.limits.as_dict(),
                "shell": plan.shell()}  # fmt: skip

    def run(self, req: RunRequest, io: RunIO | None = None) -> RunResult:
        from provision.hosts.linux.run import execute

        return execute.run(req, io)

    def plan_serve(self, req: ServeRequest) -> Mapping[str, Any]:
        from provision.hosts.linux.run.serve import run_request

        return self.plan_run(run_request(req))

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        from provision.hosts.linux.run.serve import LinuxGuest

        return LinuxGuest(req, out=out, err=err)

    def plan_shell(self, req: RunRequest) -> Mapping[str, Any]:
        from provision.hosts.linux.run.shell import PLANNED_TERMINAL, shell_request

        return self.plan_run(shell_request(req, PLANNED_TERMINAL))

    def shell(self, req: RunRequest) -> int:
        from provision.hosts.linux.run.shell import run_shell

        return run_shell(req)

    def doctor_checks(self, ctx: DoctorContext) -> list[Check]:
        from provision.hosts.linux.apir import host_side
        from provision.hosts.linux.doctor import linux_checks
        from provision.hosts.linux.doctor_isolation import isolation_checks

        return [*linux_checks(ctx), *host_side.doctor_checks(ctx), *isolation_checks(ctx)]

    def bench(self, req: BenchRequest) -> BenchRun:
        from provision.hosts.linux.run import bench

        return bench.run(req)

    def perplexity(self, req: PerplexityRequest) -> dict[str, Any]:
        from provision.hosts.linux.run import perplexity

        return perplexity.measure(req)

    def prepare(self, req: ToolsRequest | LaunchRequest, *, dry_run: bool = False) -> Prepared:
        if isinstance(req, LaunchRequest):
            raise wrong_platform(self.name, "provision launch (a podman machine with krunkit, macOS on Apple Silicon)",
                                 fix="on Linux use `provision run` (QEMU route); `--dry-run` shows the macOS plan "
                                 "anywhere")  # fmt: skip
        from provision.hosts.linux import prepare

        return prepare.prepare(req)

    def route_facts(self) -> HostFacts:
        from provision.hosts.linux import route_facts

        return route_facts.facts()

    def gpu_slots(self) -> int:
        from provision.hosts.linux.run import slots

        return slots.slot_count()


def host() -> LinuxHost:
    return LinuxHost()
