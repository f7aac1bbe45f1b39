"""The macOS host behind the one Host protocol: podman machine + krunkit guests, shell, serve, doctor."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from provision.hosts import BenchRequest, RunRequest, wrong_platform

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.serve.engine import Guest, ServeRequest

SHELL = ("sh", "-c", "command -v bash >/dev/null && exec bash -i; exec sh -i")


class DarwinHost:
    name = "darwin"

    def _backend(self, req: RunRequest) -> Any:
        from provision.hosts.darwin.backend import DarwinBackend

        return DarwinBackend(limits=req.limits)

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        argv = self._backend(req).guest_argv(req.stack, req.gpu, req.model_path, req.command, req.route,
                                             model_name=req.model_name)  # fmt: skip
        return {"host": self.name, "stack": req.stack.name, "argv": argv, "limits": req.limits.as_dict(),
                "shell": shlex.join(argv) + "\n"}

    def run(self, req: RunRequest) -> int:
        status: int = self._backend(req).run(req.stack, req.gpu, req.model_path, req.command, req.deadline_s, req.route)
        return status

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        from provision.hosts.darwin.backend import DarwinBackend
        from provision.hosts.darwin.runplan import Publish
        from provision.hosts.darwin.serve import ProcessGuest
        from provision.serve import engine as serving

        model_name, beside = serving.guest_files(req)  # a split model's parts under their own names
        argv = DarwinBackend().guest_argv(
            req.stack,
            req.gpu,
            req.model_path,
            req.command(),
            req.route,
            publish=Publish(req.host, req.port, serving.GUEST_PORT),
            model_name=model_name,
            model_extras=beside,
        )
        return ProcessGuest(argv, out=out, err=err)

    def shell(self, req: RunRequest) -> int:
        from provision.adapters import runner

        argv = self._backend(req).guest_argv(req.stack, req.gpu, req.model_path, SHELL, req.route,
                                             interactive=True, model_name=req.model_name)  # fmt: skip
        # podman run -it owns this terminal until the shell ends (nothing captured).
        return runner.run(argv, timeout=req.timeout_s, stdin=None, stdout=None, stderr=None).status

    def doctor_checks(self, ctx: DoctorContext) -> list[Check]:
        from provision.hosts.darwin.doctor import darwin_checks
        from provision.hosts.darwin.doctor_isolation import isolation_checks
        from provision.hosts.darwin.traps import trap_checks

        return [*darwin_checks(ctx), *trap_checks(ctx), *isolation_checks(ctx)]

    def bench(self, req: BenchRequest) -> BenchRun:
        raise wrong_platform(
            self.name,
            "provision bench (llama-bench in QEMU guests and on the host)",
            fix="run it on a Linux host; on macOS `provision run STACK --gpu -- llama-bench -m \"$MODEL\"` "
            "benches one guest",
        )


def host() -> DarwinHost:
    return DarwinHost()
