"""`provision completion bash|zsh|fish`: the shell's completion script, and completing a command line.

Both come from argcomplete, from the same parser `provision` parses with: the script makes the
shell run ``provision`` with argcomplete's environment (``_ARGCOMPLETE=1``, ``COMP_LINE``), and
``complete_if_asked`` (the first thing main does) answers from the full parser, with stack names
from the catalog, model names from the catalog and the store, short names where a pull takes one,
and the running serves' names for chat and stop. argcomplete is imported only
then, so `provision --help` starts as fast as before.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Callable
from typing import Any

from provision.cli import output
from provision.cli.output import command

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "completion": "print the shell completion script for bash, zsh or fish",
}
SHELLS = ("bash", "zsh", "fish")
INSTALL = {
    "bash": 'eval "$(provision completion bash)"          # in ~/.bashrc',
    "zsh": 'eval "$(provision completion zsh)"           # in ~/.zshrc, after compinit',
    "fish": "provision completion fish > ~/.config/fish/completions/provision.fish",
}
STACK_DESTS = ("stack", "venus_stack", "stack_option")
MODEL_DESTS = ("model",)


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "completion", COMMANDS["completion"], *INSTALL.values())
    p.add_argument("shell", choices=SHELLS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import argcomplete

    output.line(argcomplete.shellcode(["provision"], shell=args.shell), end="")
    return 0


def stack_names(**_: Any) -> list[str]:
    from provision.core import catalog

    return sorted(catalog.load().stacks)


def model_names(**_: Any) -> list[str]:
    """Catalog models and stored names; a broken store completes the catalog's names only."""
    from provision.models import store

    names = set(store.catalog_names())
    # Completing must never print a traceback into the shell: a broken store adds nothing.
    with contextlib.suppress(Exception):
        names.update(ref.name for ref in store.Store(out=io.StringIO()).refs())
    return sorted(names)


def pull_names(**_: Any) -> list[str]:
    """What `pull` takes by name: the short names (ours and the user's file's) and the catalog's."""
    from provision.models import shortnames, store

    names = set(store.catalog_names())
    with contextlib.suppress(Exception):  # a broken shortnames file completes the catalog alone
        names.update(shortnames.table())
    return sorted(names)


def model_or_stack_words(parsed_args: argparse.Namespace | None = None, **kw: Any) -> list[str]:
    """`provision run`'s first word: a stack, or a model to serve and chat with (`run MODEL`)."""
    if getattr(parsed_args, "cmd", None):
        return []
    return stack_names() + [n for n in model_names(**kw) + pull_names() if n not in stack_names()]


def serve_names(**_: Any) -> list[str]:
    """The serves running now (`provision ps`), for chat and stop."""
    from provision.serve import state

    with contextlib.suppress(Exception):  # an unreadable state dir completes nothing
        return [entry.name for entry in state.entries()]
    return []


# (dest, the commands whose parser has it, or () for any): what completes it
COMPLETERS: tuple[tuple[str, tuple[str, ...], Callable[..., list[str]]], ...] = (
    ("ref", ("pull",), pull_names),  # pull, model pull
    ("target", ("chat",), serve_names),
    ("name", ("stop",), serve_names),
    ("name", ("inspect", "rm", "path", "verify"), model_names),  # model …, and the top-level inspect, rm
    ("cmd", ("run",), model_or_stack_words),
)


def add_completers(parser: argparse.ArgumentParser) -> None:
    """Stack and model names for every option and positional that takes one, at every depth."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                add_completers(sub)
            continue
        completer: Callable[..., list[str]] | None = None
        if action.dest in STACK_DESTS:
            completer = stack_names
        elif action.dest in MODEL_DESTS:
            completer = model_names
        else:
            last = parser.prog.split()[-1]
            completer = next((f for dest, where, f in COMPLETERS if action.dest == dest and last in where), None)
        if completer is not None:
            action.completer = completer  # type: ignore[attr-defined]


def complete_if_asked(build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """Inside a completion request (the shell sets _ARGCOMPLETE): print the candidates, exit."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    parser = build_parser()
    add_completers(parser)
    argcomplete.autocomplete(parser)
