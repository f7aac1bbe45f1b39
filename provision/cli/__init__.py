"""Thin command line: parse, call one domain function, print, map errors to exit codes.

Each command group lives in its own module with ``register(subparsers)``; the handler it
sets returns an exit status. Errors are ProvisionError subclasses (provision/errors.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from ..errors import ProvisionError

# Order is the order shown in --help.
COMMAND_MODULES = ["stacks", "image", "model", "host_tools", "launch", "run", "bench", "doctor", "ggml", "apir", "api"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="provision", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.import_module('provision').__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except ProvisionError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": exc.as_dict()}, indent=2))
        print(exc.render(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)
