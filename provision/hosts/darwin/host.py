"""The macOS host behind the one Host protocol: podman machine + krunkit guests, shell, serve, doctor."""

from __future__ import annotations

import shlex
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
    platform_key,
    wrong_platform,
)

if TYPE_CHECKING:
    from provision.bench.report import BenchRun
    from provision.core.diagnostics import Check, DoctorContext
    from provision.hosts.darwin.backend import DarwinBackend
    from provision.routes.choose import HostFacts
    from provision.serve.engine import Guest, ServeRequest

SHELL = ("sh", "-c", "command -v bash >/dev/null && exec bash -i; exec sh -i")


class DarwinHost:
    name = "darwin"

    def _backend(self, req: RunRequest) -> DarwinBackend:
        from provision.hosts.darwin.backend import DarwinBackend

        return DarwinBackend(limits=req.limits)

    def plan_run(self, req: RunRequest) -> Mapping[str, Any]:
        argv = self._backend(req).guest_argv(req.stack, req.gpu, req.model_path, req.command, req.route,
                                             model_name=req.model_name)  # fmt: skip
        return {"host": self.name, "stack": req.stack.name, "argv": argv, "limits": req.limits.as_dict(),
                "shell": shlex.join(argv) + "\n"}

    def run(self, req: RunRequest, io: RunIO | None = None) -> RunResult:
        if io is not None and (io.out is not None or io.err is not None):
            raise wrong_platform(self.name, "a run with its output captured", fix="run it on a Linux host")
        return RunResult(self._backend(req).run(req))

    def plan_serve(self, req: ServeRequest) -> Mapping[str, Any]:
        argv = self._serve_argv(req)
        return {"host": self.name, "stack": req.stack.name, "argv": argv, "shell": shlex.join(argv) + "\n"}

    def serve_guest(self, req: ServeRequest, *, out: BinaryIO, err: BinaryIO) -> Guest:
        from provision.hosts.darwin.serve import ProcessGuest

        return ProcessGuest(self._serve_argv(req), out=out, err=err)

    def _serve_argv(self, req: ServeRequest) -> list[str]:
        from provision.hosts.darwin.backend import DarwinBackend
        from provision.hosts.darwin.runplan import Publish
        from provision.serve import engine as serving

        model_name, beside = serving.guest_files(req)  # a split model's parts under their own names
        return DarwinBackend().guest_argv(
            req.stack,
            req.gpu,
            req.model_path,
            req.command(),
            req.route,
            publish=Publish(req.host, req.port, serving.GUEST_PORT),
            model_name=model_name,
            model_extras=beside,
        )

    def _shell_argv(self, req: RunRequest) -> list[str]:
        return self._backend(req).guest_argv(req.stack, req.gpu, req.model_path, SHELL, req.route,
                                             interactive=True, model_name=req.model_name)  # fmt: skip

    def plan_shell(self, req: RunRequest) -> Mapping[str, Any]:
        argv = self._shell_argv(req)
        return {"host": self.name, "stack": req.stack.name, "argv": argv, "limits": req.limits.as_dict(),
                "shell": shlex.join(argv) + "\n"}  # fmt: skip

    def shell(self, req: RunRequest) -> int:
        from provision.adapters import runner

        argv = self._shell_argv(req)
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

    def perplexity(self, req: PerplexityRequest) -> dict[str, Any]:
        raise wrong_platform(self.name, "provision perplexity (llama-perplexity in a QEMU guest)",
                             fix="run it on a Linux host")  # fmt: skip

    def prepare(self, req: ToolsRequest | LaunchRequest, *, dry_run: bool = False) -> Prepared:
        if isinstance(req, ToolsRequest):
            raise wrong_platform(self.name, "provision host-tools (the Linux route's QEMU chroot)",
                                 fix="on macOS the krun bundle is the host side: nix profile add .#krun")  # fmt: skip
        from provision.core import pins
        from provision.hosts.darwin.backend import DarwinBackend
        from provision.hosts.darwin.launch import check_memory

        check_memory(pins.default().compat, req.memory_mib, req.vram_mib)  # before looking for anything
        backend = DarwinBackend(req.krun)
        here = platform_key() == "darwin"
        if dry_run:
            # Off macOS (or without podman) the machine cannot be asked: the plan is for a new one.
            plan, _bundle = backend.plan(req, dry_run=True, here=here)
            return Prepared(plan.as_dict(), (plan.shell(),))
        if not here:
            raise wrong_platform(platform_key(), "provision launch (a podman machine with krunkit, macOS on Apple "
                                 "Silicon)", fix="on Linux use `provision run` (QEMU route); `--dry-run` shows the "
                                 "macOS plan anywhere")  # fmt: skip
        plan = backend.launch(req)
        return Prepared({"launched": plan.as_dict()}, (f"machine {plan.machine} runs on the {plan.route} route "
                        f"(krunkit mapped {plan.expect_virglrenderer})",), warnings=tuple(plan.warnings))  # fmt: skip

    def route_facts(self) -> HostFacts:
        from provision.hosts.darwin import route_facts

        return route_facts.facts()

    def gpu_slots(self) -> int:
        return 1  # one podman machine, one GPU


def host() -> DarwinHost:
    return DarwinHost()
