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
    from provision.doctor import checks as doctor

    if not args.dry_run:  # a plan may be for another Mac; a launch runs here
        values.int_range(args.cpus, "--cpus", 1, os.cpu_count() or 1, why="the CPUs of this host")
    request = hosts.LaunchRequest(
        route=args.route,
        machine=args.machine,
        cpus=args.cpus,
        memory_mib=args.memory,
        vram_mib=args.vram if args.vram is not None else doctor.default_vram_mib(),
        apir_log_dir=args.apir_log_dir,
        krun=args.krun,
    )
    # The macOS host makes the plan anywhere (`--dry-run` on Linux reviews it); it launches on a Mac alone.
    done = hosts.get("darwin").prepare(request, dry_run=args.dry_run)
    for w in done.warnings:
        logging.getLogger("provision.launch").warning("warning: %s", w)
    return Result(dict(done.data), "\n".join(done.lines))
