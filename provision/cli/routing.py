"""The stack a command runs when none is named: `provision run --gpu`, `serve --gpu`, `bench`.

A named stack (positional or ``--stack``) is used as it is; otherwise provision.routes picks
one for this host and says why in one line on stderr (stdout stays the command's own).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provision.core.errors import InvalidValue

if TYPE_CHECKING:
    from provision.core.catalog import Stack


def add_stack_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stack", dest="stack_option", default=None, metavar="STACK",
                   help="the stack to use (default: chosen for this host, with the reason printed)")  # fmt: skip


def take_positional(args: argparse.Namespace, words: list[str]) -> list[str]:
    """``[STACK] [options] -- CMD``: the leading word is the stack unless it is ``--`` or an option."""
    if words and words[0] != "--" and not words[0].startswith("-"):
        args.stack = words[0]
        return words[1:]
    args.stack = None
    return words


def stack_for(args: argparse.Namespace, *, gpu: bool, command: str) -> Stack:
    from provision.core import catalog

    named, option = getattr(args, "stack", None), getattr(args, "stack_option", None)
    if named and option and named != option:
        raise InvalidValue(f"provision {command}: stack {named!r} and --stack {option!r}", fix="name one stack")
    cat = catalog.load()
    if named or option:
        return cat.get(str(named or option))
    route = getattr(args, "route", None)
    if not gpu and route is None:
        raise InvalidValue(
            f"provision {command}: no STACK, and neither --gpu nor --route to pick one by",
            fix=f"provision {command} --gpu … (provision picks the stack), or name one (`provision stacks`)",
        )
    from provision import hosts
    from provision.routes import choose

    decision = choose.choose(hosts.native().route_facts(), cat.stacks, gpu=gpu, route=route)
    args.app.say("route")(f"provision: {decision.line()}")
    return cat.get(decision.stack)
