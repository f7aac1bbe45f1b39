"""`provision bench list` and `provision bench compare A B`: the bench history as tables or JSON.

Every `provision bench` and `provision perplexity` run appends a record (provision/bench/history_file.py);
these read it back. Registered under `bench` by provision/cli/bench.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provision.cli.output import command, table
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.core.catalog import Stack

FORMATS = ("table", "json")


def _format(p: argparse.ArgumentParser) -> None:
    # `--format json` is another spelling of `--json` (the one envelope; provision/cli/__init__.py reads both)
    p.add_argument("--format", choices=FORMATS, default="table", help="table (default) or json (= --json)")


def register(actions: argparse._SubParsersAction) -> None:
    p = command(actions, "list", "list the bench history (every bench and perplexity run)",
                "provision bench list", "provision bench list --stack llama-linux --format json",
                json=True)  # fmt: skip
    p.add_argument("--stack", default=None, help="only this stack's records")
    p.add_argument("--kind", choices=("bench", "perplexity"), default=None, help="only benches or perplexities")
    p.add_argument("--last", type=int, default=None, metavar="N", help="only the newest N records")
    _format(p)
    p.set_defaults(func=list_cmd)

    p = command(actions, "compare", "compare two history records: each number side by side and B/A",
                "provision bench compare -2 -1    (the two newest)", "provision bench compare 3f2a 9c01",
                json=True)  # fmt: skip
    p.add_argument("a", metavar="A", help="a record id (unique prefix) or a position: -1 the newest, -2 ...")
    p.add_argument("b", metavar="B", help="the record to compare with A (ratios are B/A)")
    _format(p)
    p.set_defaults(func=compare_cmd)


def record_bench(
    stack: Stack, model: Path, label: str, report: dict[str, Any], gpu_where: str, outputs: list[str]
) -> dict[str, str]:
    from provision.bench import history_file

    record = history_file.record_bench(stack, model, label, report, gpu_where, outputs)
    return {"id": record.id, "file": str(history_file.path())}


def _warn_skipped(skipped: int) -> None:
    if skipped:
        import logging

        logging.getLogger("provision.bench").warning(
            "%d line(s) of the history are not records (torn or edited); skipped", skipped)


def list_cmd(args: argparse.Namespace) -> Result:
    from provision.bench import history, history_file
    from provision.core import values

    values.int_range(args.last, "--last", 1, 1_000_000)
    records, skipped = history_file.load()
    _warn_skipped(skipped)
    chosen = history.select(records, stack=args.stack, kind=args.kind)
    if args.last is not None:
        chosen = chosen[-args.last :]

    def text() -> str:
        if not chosen:
            return f"no records in {history_file.path()}" + (" that match" if records else "; run `provision bench`")
        return table(history.LIST_HEADERS, history.list_rows(chosen))

    return Result([r.as_dict() for r in chosen], text)


def compare_cmd(args: argparse.Namespace) -> Result:
    from provision.bench import history, history_file

    records, skipped = history_file.load()
    _warn_skipped(skipped)
    a, b = history.pick(records, args.a), history.pick(records, args.b)
    rows = history.compare(a, b)
    notes = history.differences(a, b)

    def text() -> str:
        lines = [f"A: {a.id}  {a.time}  {a.kind} {a.stack} ({a.route})  {a.model}",
                 f"B: {b.id}  {b.time}  {b.kind} {b.stack} ({b.route})  {b.model}\n",
                 table(history.COMPARE_HEADERS, history.compare_rows(rows))]  # fmt: skip
        if notes:
            lines.append("\nthe runs differ in: " + "; ".join(notes))
        return "\n".join(lines)

    data = {"a": a.as_dict(), "b": b.as_dict(), "rows": [c.as_dict() for c in rows], "differences": notes}
    return Result(data, text)
