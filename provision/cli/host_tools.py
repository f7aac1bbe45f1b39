"""`provision host-tools`: make (or show) the Debian sid chroot that runs QEMU for the Linux route."""

from __future__ import annotations

import argparse

from .. import host_tools
from ..diagnostics import failed
from .output import dumps, table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("host-tools", help="make the cached chroot with QEMU + virglrenderer (Linux route)")
    p.add_argument("--check", action="store_true", help="only report what is there (doctor-style), build nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when a cached chroot exists")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.check:
        host_tools.make(force=args.force)
    checks = host_tools.checks()
    if args.json:
        tools = host_tools.locate()
        print(dumps({"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]}))
    else:
        print(
            table(["CHECK", "STATUS", "EVIDENCE", "FIX"], [(c.id, c.status, c.evidence, c.fix or "") for c in checks])
        )
    return 1 if failed(checks) else 0
