"""The macOS host backend: podman machine (libkrun provider) with the krun bundle's krunkit.

``launch`` turns a LaunchRequest into a LaunchPlan (pure, provision/hosts/darwin/launch.py) after probing
the machine and the tool versions, then executes it: podman steps with the plan's env,
``lsof -c krunkit`` to confirm our virglrenderer is mapped, and the route recorded.
``run`` executes a RunPlan (provision/hosts/darwin/runplan.py) on the running machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from provision.adapters import lsof, podman_machine, runner
from provision.core import catalog, pins
from provision.core.catalog import Stack
from provision.core.errors import (
    ApirCheckFailed,
    ImageBuildFailed,
    MachineFailed,
    RunTimeout,
    ToolMissing,
    UnknownRoute,
    VersionSkew,
)
from provision.core.isolation import GuestLimits
from provision.hosts import RunRequest
from provision.hosts.darwin import bundle as bundle_mod
from provision.hosts.darwin import machine_state, versions
from provision.hosts.darwin.bundle import KrunBundle
from provision.hosts.darwin.doctor import libkrun_version
from provision.hosts.darwin.launch import LaunchPlan, LaunchRequest, plan_launch
from provision.hosts.darwin.runplan import Publish, image_repo, plan_run


def observe_machine(name: str, env: dict[str, str]) -> podman_machine.MachineInfo | None:
    res = runner.probe(podman_machine.inspect_cmd(name), env={**env, "CONTAINERS_MACHINE_PROVIDER": "libkrun"})
    if res is None:
        raise ToolMissing("podman is not installed", fix="install podman >= 5.2 (the pkg installer or Homebrew)")
    if res[0] != 0:
        return None  # "VM does not exist"
    return podman_machine.find(podman_machine.parse_inspect(res[1]), name)


def check_pairing(b: KrunBundle, env: dict[str, str]) -> None:
    """E032 before anything starts when podman, krunkit and libkrun do not pair."""
    compat = pins.default().compat
    pv = runner.probe(podman_machine.version_cmd(), env=env)
    kv = runner.probe([str(b.krunkit), "--version"], env=env)
    try:
        podman_v = versions.parse_podman(pv[1]) if pv else None
        krunkit_v = versions.parse_krunkit(kv[1]) if kv else None
    except ValueError as exc:
        raise VersionSkew(str(exc), fix="run `provision doctor` for details") from None
    problems = versions.pairing_problems(compat, podman=podman_v, krunkit=krunkit_v, libkrun=libkrun_version(b))
    if problems:
        raise VersionSkew("; ".join(p.what for p in problems), fix=problems[0].fix)


def verify_virglrenderer(lsof_output: str, expected: str) -> str:
    """The mapped libvirglrenderer path, or E034 when krunkit mapped none or another one."""
    libs = lsof.libraries_named(lsof.parse_fields(lsof_output), "libvirglrenderer")
    want = Path(expected).resolve()
    if not libs:
        raise MachineFailed(
            "krunkit is not running or mapped no libvirglrenderer (GPU off)",
            fix="run `provision doctor`; check `podman machine start --log-level=debug`",
        )
    wrong = [p for p in libs if Path(p).resolve() != want]
    if wrong:
        raise MachineFailed(
            f"krunkit mapped {', '.join(wrong)}, not our {want}",
            fix="another krunkit/virglrenderer is first in podman's helper search; run `provision doctor`",
        )
    return libs[0]


def newest_image(stack: Stack) -> str:
    """The most recent image `provision image build STACK` made (podman lists newest first)."""
    repo = image_repo(stack)
    res = runner.probe(["podman", "images", "--filter", f"reference={repo}", "--format", "{{.Repository}}:{{.Tag}}"])
    if res is None:
        raise ToolMissing("podman is not installed", fix="install podman >= 5.2")
    refs = [line.strip() for line in res[1].splitlines() if line.strip().startswith(repo + ":")]
    if res[0] != 0 or not refs:
        raise ImageBuildFailed(f"no image {repo}:* on the podman machine", fix=f"provision image build {stack.name}")
    return refs[0]


class DarwinBackend:
    name = "darwin"

    def __init__(self, krun: Path | None = None, limits: GuestLimits | None = None) -> None:
        self.krun = krun
        self.limits = limits or GuestLimits()

    def plan(
        self, request: LaunchRequest, *, env: dict[str, str] | None = None, dry_run: bool = False, here: bool = True
    ) -> tuple[LaunchPlan, KrunBundle]:
        """The launch plan. A dry run away from the Mac (``here=False``) or without podman plans as
        for a new machine; a launch without podman is E006."""
        env = dict(os.environ) if env is None else env
        b = bundle_mod.locate(self.krun, env=env, route=request.route)
        ask = not dry_run or (here and runner.found("podman") is not None)
        machine = observe_machine(request.machine, env) if ask else None
        plan = plan_launch(
            request,
            b,
            pins.default().compat,
            machine=machine,
            recorded_route=machine_state.recorded_route(request.machine),
        )
        return plan, b

    def launch(self, request: LaunchRequest) -> LaunchPlan:
        env = dict(os.environ)
        plan, b = self.plan(request, env=env)
        check_pairing(b, env)
        if plan.route == "apir":
            for key in ("VIRGL_APIR_BACKEND_LIBRARY", "APIR_LLAMA_CPP_GGML_LIBRARY_PATH"):
                if not Path(plan.env[key]).is_file():
                    raise ApirCheckFailed(
                        f"{key}={plan.env[key]}: no such file in the krun bundle",
                        fix="install the full bundle (nix profile add .#krun), or use --route venus",
                    )
        child = plan.child_env(env)
        for step in plan.steps:
            proc = runner.run(list(step.argv), env=child, missing_fix="install podman (brew install podman)")
            if proc.status != 0:
                tail = (proc.err or proc.out).strip()[-800:]
                if "krunkit: unexpected argument" in tail:  # podman#29439: podman newer than krunkit
                    raise VersionSkew(
                        f"`{' '.join(step.argv)}`: {tail}", fix="run `provision doctor` (versions.pairing)"
                    )
                raise MachineFailed(
                    f"`{' '.join(step.argv)}` exited {proc.status}: {tail}",
                    fix="run `provision doctor`; `krunkit: unexpected argument` means version skew",
                )
        out = runner.probe(list(plan.verify.argv), env=child)
        if out is None:
            raise ToolMissing("lsof is not installed", fix="lsof ships with macOS; check PATH")
        mapped = verify_virglrenderer(out[1], plan.expect_virglrenderer)
        machine_state.record_route(plan.machine, plan.route, virglrenderer=mapped)
        return plan

    def checked_route(self, stack: Stack, gpu: bool, route: str | None, machine: str) -> str:
        catalog.check_gpu(stack, gpu)
        chosen = catalog.check_route(stack, route)
        if gpu:
            # krunkit's route is fixed at machine start: a GPU run on the wrong one cannot work.
            recorded = machine_state.recorded_route(machine)
            if recorded != chosen:
                raise UnknownRoute(
                    f"machine {machine} was launched on route {recorded or '(none: not started by provision)'}, "
                    f"stack {stack.name!r} needs {chosen}",
                    fix=f"provision launch --route {chosen}",
                )
        return chosen

    def guest_argv(
        self,
        stack: Stack,
        gpu: bool,
        model_path: Path | None,
        command: Sequence[str],
        route: str | None,
        *,
        publish: Publish | None = None,
        interactive: bool = False,
        model_name: str | None = None,
        machine: str = podman_machine.DEFAULT_MACHINE,
        model_extras: Mapping[str, Path] | None = None,
    ) -> list[str]:
        """`podman run` for run, serve (a published port) and shell (``-it``), after the run's checks."""
        chosen = self.checked_route(stack, gpu, route, machine)
        plan = plan_run(
            stack,
            gpu=gpu,
            route=chosen,
            model_path=model_path,
            command=command,
            compat=pins.default().compat,
            image=newest_image(stack),
            limits=self.limits,
            publish=publish,
            interactive=interactive,
            model_name=model_name,
            model_extras=model_extras,
        )
        return list(plan.argv)

    def run(self, req: RunRequest, machine: str = podman_machine.DEFAULT_MACHINE) -> int:
        argv = self.guest_argv(req.stack, req.gpu, req.model_path, req.command, req.route, machine=machine)
        # The guest's output is the command's: straight to this terminal, not captured.
        proc = runner.run(argv, timeout=req.deadline_s, stdout=None, stderr=None, missing_fix="install podman")
        if proc.timed_out:
            raise RunTimeout(
                f"{' '.join(req.command)} did not finish within {req.deadline_s} s",
                fix="raise --timeout, or check the GPU with `provision doctor`",
            )
        return proc.status


def backend() -> DarwinBackend:
    return DarwinBackend()
