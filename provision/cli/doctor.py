"""`provision doctor [--json]`: check this host's route; exit 0 when all pass, 1 when one fails."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import checks_table, command, table
from provision.core import values
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "doctor": "check this host's GPU route (what is there, what is missing, the fix) and list the settings",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "doctor", COMMANDS["doctor"], "provision doctor", "provision doctor --json", json=True)
    p.add_argument("--krun", type=Path, default=None, help="krun bundle prefix (default: the Nix profile)")
    p.add_argument("--machine", default=None, help="podman machine name (macOS)")
    p.add_argument("--guest-image", default=None, help="also run the guest checks in a container of IMAGE (macOS)")
    p.set_defaults(func=run)


def settings_table(rows: list[dict[str, object]]) -> str:
    return table(["SETTING", "VALUE", "SOURCE"], [(r["key"], r["value"], r["source"]) for r in rows])


def run(args: argparse.Namespace) -> Result:
    from provision.doctor import checks as doctor

    if args.machine is not None:
        values.machine_name(args.machine)
    if args.guest_image is not None:
        values.image_ref(args.guest_image, "--guest-image")

    ctx = doctor.context(krun=args.krun, machine=args.machine, guest_image=args.guest_image)
    checks = doctor.run(ctx)
    data = doctor.report(ctx, checks, args.app.settings)
    return Result(
        data,
        lambda: f"{checks_table(checks)}\n\n{settings_table(data['settings'])}",
        exit_status=doctor.exit_status(checks),
    )
