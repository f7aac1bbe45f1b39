"""The Linux host behind the one Host protocol: QEMU + virglrenderer guests, shell, serve, doctor, bench."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from provision.hosts import BenchRequest, RunRequest

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.serve.engine import Guest, ServeRequest


class LinuxHost:
    name = "linux"

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        """The frozen RunPlan (runplan.py) as data, with ``shell``: what `provision run --dry-run` prints."""
        from provision.hosts.linux.backend import LinuxBackend

        plan = LinuxBackend(limits=req.limits).plan_run(
            req.stack, req.gpu, req.model_path, req.command, req.deadline_s, req.route, model_name=req.model_name
        )
        return {"host": self.name, **plan.as_dict(), "limits": req.limits.as_dict(), "shell": plan.shell()}

    def run(self, req: RunRequest) -> int:
        from provision.hosts.linux.backend import LinuxBackend

        backend = LinuxBackend(limits=req.limits)
        return backend.run(req.stack, req.gpu, req.model_path, req.command, req.deadline_s, req.route)

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        from provision.hosts.linux.serve import LinuxGuest

        return LinuxGuest(req, out=out, err=err)

    def shell(self, req: RunRequest) -> int:
        from provision.hosts.linux.shell import run_shell

        return run_shell(req.stack, req.gpu, req.model_path, req.model_name, req.route, req.timeout_s)

    def doctor_checks(self, ctx: DoctorContext) -> list[Check]:
        from provision.hosts.linux import apir_host
        from provision.hosts.linux.doctor import linux_checks
        from provision.hosts.linux.doctor_isolation import isolation_checks

        return [*linux_checks(ctx), *apir_host.doctor_checks(ctx), *isolation_checks(ctx)]

    def bench(self, req: BenchRequest) -> BenchRun:
        from provision.hosts.linux import bench_run

        return bench_run.run(req)


def host() -> LinuxHost:
    return LinuxHost()
