"""`provision host-tools`: make (or show) the Debian sid chroot that runs QEMU for the Linux route."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import EXAMPLE_FORMAT, dumps, example, table
from provision.core import values
from provision.core.errors import InvalidValue

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "host-tools": "make the cached chroot with QEMU + virglrenderer (Linux route)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "host-tools",
        help=COMMANDS["host-tools"],
        epilog=example("sudo provision host-tools", "sudo provision host-tools --apir --virgl-src ~/src/virglrenderer"),
        formatter_class=EXAMPLE_FORMAT,
    )
    p.add_argument("--check", action="store_true", help="only report what is there (doctor-style), build nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when a cached chroot exists")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--apir",
        action="store_true",
        help="also build virglrenderer with APIR and the host ggml (Vulkan) in the chroot (route apir)",
    )
    p.add_argument(
        "--virgl-src",
        type=Path,
        help="with --apir: a local clone or mirror of the pinned APIR virglrenderer tree (checked against the pin)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision.apir import host as apir_host
    from provision.core.diagnostics import failed
    from provision.hosts.linux import tools as host_tools

    if args.virgl_src is not None and not args.apir:
        raise InvalidValue("--virgl-src is only used with --apir", fix="add --apir, or drop --virgl-src")
    values.existing_dir(args.virgl_src, "--virgl-src")
    if not args.check:
        if args.apir:
            apir_host.make(args.virgl_src)  # makes the base chroot first when needed
        else:
            host_tools.make(force=args.force)
    checks = host_tools.checks()
    if args.apir or apir_host.locate() is not None:
        checks += apir_host.checks()
    if args.json:
        tools = host_tools.locate()
        print(dumps({"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]}))
    else:
        print(
            table(["CHECK", "STATUS", "EVIDENCE", "FIX"], [(c.id, c.status, c.evidence, c.fix or "") for c in checks])
        )
    return 1 if failed(checks) else 0
