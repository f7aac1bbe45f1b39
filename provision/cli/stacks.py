"""`provision stacks`: the stack catalog as a table or JSON."""

from __future__ import annotations

import argparse

from provision.cli.output import command, dumps, table

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "stacks": "list guest stacks",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "stacks", COMMANDS["stacks"], "provision stacks", "provision stacks --json")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision.core import catalog

    stacks = catalog.load().stacks
    if args.json:
        print(dumps([s.as_dict() for s in stacks.values()]))
        return 0
    rows = [
        (s.name, s.route, ",".join(s.hosts), s.base, "yes" if s.gpu else "no", s.device or "-", s.description)
        for s in stacks.values()
    ]
    print(table(["STACK", "ROUTE", "HOSTS", "BASE", "GPU", "DEVICE", "DESCRIPTION"], rows))
    return 0
