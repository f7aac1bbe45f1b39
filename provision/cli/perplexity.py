"""`provision perplexity [STACK] --model NAME [--gpu] [--text FILE]`: llama-perplexity in a guest.

Thin: parse, this host's ``perplexity`` (device rules as `run`, the text mounted read-only beside
the model, the result added to the bench history), print.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli import routing
from provision.cli.output import command, table
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "perplexity": "llama-perplexity of a model on a text, in a guest (recorded in the bench history)",
}
DEFAULT_CTX = 256  # = provision.bench.perplexity.DEFAULT_CTX (not imported: --help stays light)
DEFAULT_CHUNKS = 8


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "perplexity", COMMANDS["perplexity"],
                "provision perplexity llama-linux --model tiny-llama --gpu",
                "provision perplexity --model tiny-llama --gpu    # the stack for this host, and why",
                "provision perplexity llama-linux --model tiny-llama --text notes.txt --format json",
                json=True)  # fmt: skip
    p.add_argument("stack", nargs="?", help="default: chosen for this host with --gpu/--route (the why is printed)")
    routing.add_stack_option(p)
    p.add_argument("--model", required=True, help="a verified model (store name) or a GGUF path, mounted read-only")
    p.add_argument("--gpu", action="store_true", help="all layers on the stack's GPU device (E007 without GPU)")
    p.add_argument("--route", choices=("venus", "apir", "cpu"), default=None, help="default: the stack's route")
    p.add_argument("--text", type=Path, default=None,
                   help="plain text file, mounted read-only (default: a 4 KB English text shipped with provision)")
    p.add_argument("--ctx", type=int, default=DEFAULT_CTX, help=f"context per chunk in tokens (default {DEFAULT_CTX})")
    p.add_argument("--chunks", type=int, default=DEFAULT_CHUNKS,
                   help=f"most chunks to evaluate (default {DEFAULT_CHUNKS}; bounds the run time)")
    p.add_argument("--timeout", type=float, default=900, metavar="S", help="seconds for the guest run (default 900)")
    # `--format json` is another spelling of `--json` (the one envelope)
    p.add_argument("--format", choices=("table", "json"), default="table", help="table (default) or json (= --json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Result:
    from provision import hosts
    from provision.cli.run import resolve_model
    from provision.core import catalog

    stack = routing.stack_for(args, gpu=args.gpu, command="perplexity")
    catalog.check_gpu(stack, args.gpu)  # before the model is fetched: no silent CPU fallback
    label = Path(args.model).name if Path(args.model).is_file() else args.model

    def model() -> Path:
        path = resolve_model(args.model)
        assert path is not None  # --model is required
        return path

    req = hosts.PerplexityRequest(stack, args.gpu, model, label, args.ctx, args.chunks, text=args.text,
                                  timeout_s=args.timeout, route=args.route)  # fmt: skip
    data = hosts.native().perplexity(req)
    rows = [(data["where"], data["model"], f"{data['ppl']:.4f}", f"{data['error']:.4f}", data["ctx"], data["text"])]
    text = (table(("WHERE", "MODEL", "PPL", "+/-", "CTX", "TEXT"), rows)
            + f"\nhistory: record {data['history']['id']} in {data['history']['file']}")  # fmt: skip
    return Result(data, text)
