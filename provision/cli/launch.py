"""`provision launch`: bring the podman machine up on the Venus or APIR route (macOS).

``--dry-run`` prints the plan without running anything: shell lines to source (the env)
with the podman steps as comments, or ``--json``. It works on any OS, so a plan can be
reviewed before it is run on the Mac.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from provision.cli.output import command, dumps
from provision.core import values
from provision.core.errors import WrongPlatform

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "launch": "start the podman machine (krunkit) on the venus or apir route (macOS)",
}


def register(sub: argparse._SubParsersAction) -> None:
    from provision.adapters.podman_machine import DEFAULT_MACHINE
    from provision.core.catalog import GPU_ROUTES

    p = command(sub, "launch", COMMANDS["launch"], "provision launch", "provision launch --route apir --dry-run")
    p.add_argument("--route", choices=GPU_ROUTES, default="venus")
    p.add_argument("--machine", default=DEFAULT_MACHINE)
    p.add_argument("--cpus", type=int, default=None)
    p.add_argument("--memory", type=int, default=None, metavar="MiB", help="guest RAM (krunkit caps it at 61440)")
    p.add_argument(
        "--vram",
        type=int,
        default=None,
        metavar="MiB",
        help="VRAM the GPU stacks need (default: the largest gpu_vram_mib of the darwin stacks)",
    )
    p.add_argument("--krun", type=Path, default=None, help="krun bundle prefix (default: the Nix profile)")
    p.add_argument("--apir-log-dir", default=None, help="APIR route: write virglrenderer/ggml APIR logs here")
    p.add_argument("--dry-run", action="store_true", help="print the plan (shell lines to source) and run nothing")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON; otherwise the result")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision.core import pins
    from provision.doctor import checks as doctor
    from provision.hosts.darwin import bundle as bundle_mod
    from provision.hosts.darwin import machine_state
    from provision.hosts.darwin.backend import DarwinBackend, observe_machine
    from provision.hosts.darwin.launch import LaunchRequest, check_memory, plan_launch

    if not args.dry_run:  # a plan may be for another Mac; a launch runs here
        values.int_range(args.cpus, "--cpus", 1, os.cpu_count() or 1, why="the CPUs of this host")
    request = LaunchRequest(
        route=args.route,
        machine=args.machine,
        cpus=args.cpus,
        memory_mib=args.memory,
        vram_mib=args.vram if args.vram is not None else doctor.default_vram_mib(),
        apir_log_dir=args.apir_log_dir,
    )
    check_memory(pins.default().compat, request.memory_mib, request.vram_mib)  # before looking for anything
    if args.dry_run:
        env = dict(os.environ)
        b = bundle_mod.locate(args.krun, env=env, route=request.route)
        # Off macOS (or without podman) the machine cannot be asked: plan as for a new one.
        machine = observe_machine(request.machine, env) if sys.platform == "darwin" and shutil.which("podman") else None
        plan = plan_launch(
            request,
            b,
            pins.default().compat,
            machine=machine,
            recorded_route=machine_state.recorded_route(request.machine),
        )
        print(dumps(plan.as_dict()) if args.json else plan.shell(), end="" if not args.json else "\n")
        return 0
    if sys.platform != "darwin":
        raise WrongPlatform(
            "provision launch starts a podman machine with krunkit, which needs macOS on Apple Silicon",
            fix="on Linux use `provision run` (QEMU route); `--dry-run` shows the macOS plan anywhere",
        )
    plan = DarwinBackend(args.krun).launch(request)
    if args.json:
        print(dumps({"launched": plan.as_dict()}))
    else:
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"machine {plan.machine} runs on the {plan.route} route (krunkit mapped {plan.expect_virglrenderer})")
    return 0
