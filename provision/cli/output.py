"""The one renderer: tables, and every report as text or one JSON envelope.

Handlers return a ``provision.core.result.Result``; ``emit`` prints it as text, or with
``--json`` as ``{"command", "status", "data", "error"}`` (sorted keys), errors included. A
command that has a report gets ``--json`` from ``command(..., json=True)``: the flag is
declared here and nowhere else. This is the only module under ``provision/cli/`` that prints
(tests/test_architecture.py holds it): progress and warnings go to the logger (``core/log.py``),
so ``-q`` and the log file see them; what is printed here is a result, an error, or a line an
interactive command owes the person at the terminal (a question, a chat note).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from provision.core.result import Result, as_result, envelope


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def checks_table(checks: Sequence[Any]) -> str:
    """Checks (provision.core.diagnostics.Check) in the one column order doctor and host-tools share."""
    rows = [(c.status.upper(), c.id, c.evidence, c.fix or "") for c in checks]
    return table(["STATUS", "CHECK", "EVIDENCE", "FIX"], rows)


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)


def emit(command: str, outcome: Result | int | None, *, as_json: bool) -> int:
    """Print a handler's outcome (text on stdout, its error on stderr); return the exit status."""
    result = as_result(outcome)
    if as_json:
        print(dumps(envelope(command, result)))
    else:
        text = result.render_text()
        if text:
            print(text, end="" if text.endswith("\n") else "\n")
    if result.error is not None:
        print(result.error.render(), file=sys.stderr)
    return result.exit


def line(text: str, *, end: str = "\n") -> None:
    """A result line on stdout before the command's end (the URL a foreground serve answers on,
    a completion script): what a script reads, whatever the verbosity."""
    print(text, end=end, flush=True)


def error_line(text: str) -> None:
    """An error on stderr (shown under ``-q`` too)."""
    print(text, file=sys.stderr, flush=True)


def note(text: str) -> None:
    """A line of an interactive session (chat's ``/clear`` answer) on stderr, beside its prompt."""
    print(text, file=sys.stderr, flush=True)


def ask(question: str, *, on_stdout: bool = False) -> str:
    """Ask the person at the terminal: the answer's line (EOFError at the end of input). The
    question goes to stderr unless ``on_stdout`` (where a session's tokens go)."""
    if on_stdout:
        return input(question)
    print(question, end="", file=sys.stderr, flush=True)
    return input()


def human_stream(args: argparse.Namespace) -> TextIO:
    """Where a command streams what a person reads while it works: stderr when ``--json`` keeps
    stdout for the envelope alone."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def emit_error(command: str, error: dict[str, Any]) -> None:
    """With ``--json``, a failure is the same envelope (status "error", data null) on stdout."""
    print(dumps(envelope(command, None, error)))


# Epilogs keep their line breaks: each command's help ends with examples to copy.
EXAMPLE_FORMAT = argparse.RawDescriptionHelpFormatter
JSON_HELP = 'print one JSON object on stdout: {"command", "status", "data", "error"}'


def example(*commands: str) -> str:
    return "example:\n" + "\n".join(f"  {c}" for c in commands)


def verbosity_flags(parser: argparse.ArgumentParser, *, default: Any = argparse.SUPPRESS) -> None:
    """-v / -q, on the root parser and on every command (so they may follow the command's name)."""
    parser.add_argument("-v", "--verbose", action="count", default=default,
                        help="say more on stderr (-v: each program run; -vv: debug)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default, help="only errors on stderr")


def command(
    sub: argparse._SubParsersAction, name: str, help: str, *examples: str, json: bool = False
) -> argparse.ArgumentParser:
    """A subcommand whose help ends with examples to copy; ``json=True`` gives it ``--json``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, epilog=example(*examples), formatter_class=EXAMPLE_FORMAT
    )
    verbosity_flags(parser)
    if json:
        parser.add_argument("--json", action="store_true", help=JSON_HELP)
    parser.set_defaults(command_name=parser.prog.removeprefix("provision "))
    return parser
