"""Plain-text tables and JSON for every report (every report has --json)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, default=str)


# Epilogs keep their line breaks: each command's help ends with examples to copy.
EXAMPLE_FORMAT = argparse.RawDescriptionHelpFormatter


def example(*commands: str) -> str:
    return "example:\n" + "\n".join(f"  {c}" for c in commands)


def command(sub: argparse._SubParsersAction, name: str, help: str, *examples: str) -> argparse.ArgumentParser:
    """A subcommand whose help ends with examples to copy."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, epilog=example(*examples), formatter_class=EXAMPLE_FORMAT
    )
    return parser
