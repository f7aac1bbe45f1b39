"""`provision launch`: bring the podman machine up on the Venus or APIR route (macOS).

``--dry-run`` prints the plan without running anything: shell lines to source (the env)
with the podman steps as comments, or ``--json``. It works on any OS, so a plan can be
reviewed before it is run on the Mac.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from provision.cli.output import command
from provision.core import values
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "launch": "start the podman machine (krunkit) on the venus or apir route (macOS)",
}


def register(sub: argparse._SubParsersAction) -> None:
    from provision.adapters.podman_machine import DEFAULT_MACHINE
    from provision.core.catalog import GPU_ROUTES

    p = command(sub, "launch", COMMANDS["launch"], "provision launch", "provision launch --route apir --dry-run",
                json=True)
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Result:
    from provision import hosts
    from provision.core import pins
    from provision.doctor import checks as doctor
    from provision.hosts.darwin.backend import DarwinBackend
    from provision.hosts.darwin.launch import LaunchRequest, check_memory

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
    backend = DarwinBackend(args.krun)
    if args.dry_run:
        # Off macOS (or without podman) the machine cannot be asked: the plan is for a new one.
        plan, _bundle = backend.plan(request, dry_run=True, here=hosts.native_is("darwin"))
        return Result(plan.as_dict(), plan.shell())
    if not hosts.native_is("darwin"):
        raise hosts.wrong_platform(
            hosts.platform_key(),
            "provision launch (a podman machine with krunkit, macOS on Apple Silicon)",
            fix="on Linux use `provision run` (QEMU route); `--dry-run` shows the macOS plan anywhere",
        )
    plan = backend.launch(request)
    for w in plan.warnings:
        logging.getLogger("provision.launch").warning("warning: %s", w)
    return Result({"launched": plan.as_dict()},
                  f"machine {plan.machine} runs on the {plan.route} route (krunkit mapped {plan.expect_virglrenderer})")
