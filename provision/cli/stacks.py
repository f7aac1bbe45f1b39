"""`provision stacks`: the stack catalog as a table or JSON."""

from __future__ import annotations

import argparse

from provision.cli.output import command, table
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "stacks": "list guest stacks",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "stacks", COMMANDS["stacks"], "provision stacks", "provision stacks --json", json=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Result:
    from provision.core import catalog

    stacks = catalog.load().stacks
    rows = [
        (s.name, s.route, ",".join(s.hosts), s.base, "yes" if s.gpu else "no", s.device or "-", s.description)
        for s in stacks.values()
    ]
    return Result(
        data=[s.as_dict() for s in stacks.values()],
        text=lambda: table(["STACK", "ROUTE", "HOSTS", "BASE", "GPU", "DEVICE", "DESCRIPTION"], rows),
    )
