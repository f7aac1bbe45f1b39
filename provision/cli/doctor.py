"""`provision doctor [--json]`: check this host's route; exit 0 when all pass, 1 when one fails."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import command, dumps, table
from provision.core import values

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "doctor": "check this host's GPU route (what is there, what is missing, the fix)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "doctor", COMMANDS["doctor"], "provision doctor", "provision doctor --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--krun", type=Path, default=None, help="krun bundle prefix (default: the Nix profile)")
    p.add_argument("--machine", default=None, help="podman machine name (macOS)")
    p.add_argument("--guest-image", default=None, help="also run the guest checks in a container of IMAGE (macOS)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision.doctor import checks as doctor

    if args.machine is not None:
        values.machine_name(args.machine)
    if args.guest_image is not None:
        values.image_ref(args.guest_image, "--guest-image")

    ctx = doctor.context(krun=args.krun, machine=args.machine, guest_image=args.guest_image)
    checks = doctor.run(ctx)
    if args.json:
        print(dumps(doctor.report(ctx, checks)))
    else:
        rows = [(c.status.upper(), c.id, c.evidence, c.fix or "") for c in checks]
        print(table(["STATUS", "CHECK", "EVIDENCE", "FIX"], rows))
    return doctor.exit_status(checks)
