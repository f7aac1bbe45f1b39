"""`provision run STACK [--gpu] [--route R] [--model NAME] [--timeout S] -- CMD…`.

Thin dispatcher: the host backend for this platform (provision.hosts.native_backend)
does the work; GPU/route rules are the catalog's, so E007 is the same on every host.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from provision.cli.output import EXAMPLE_FORMAT, example
from provision.core.errors import UnknownModel


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a command in a guest of STACK (podman machine on macOS, QEMU on Linux)",
        epilog=example("provision run llama-linux --gpu --model tiny-llama -- vulkaninfo --summary"),
        formatter_class=EXAMPLE_FORMAT,
    )
    _options(p)
    p.add_argument("stack")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run in the guest")
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", action="store_true", help="give the guest the host GPU (E007 on a stack without GPU)")
    p.add_argument("--route", choices=("venus", "apir", "cpu"), default=None, help="default: the stack's route")
    p.add_argument("--model", default=None, help="a verified model (store name) or a GGUF path, mounted read-only")
    p.add_argument("--timeout", type=float, default=None, metavar="S")


def split_command(args: argparse.Namespace) -> list[str]:
    """REMAINDER swallows options written after STACK (`run llama --gpu -- cmd`): parse them here."""
    rest = list(args.cmd)
    if "--" not in rest:
        return rest
    i = rest.index("--")
    opts, cmd = rest[:i], rest[i + 1 :]
    if opts:
        late = argparse.ArgumentParser(prog="provision run STACK", add_help=False)
        _options(late)
        late.parse_args(opts, namespace=args)
    return cmd


def resolve_model(ref: str | None) -> Path | None:
    """A GGUF path as given, else a store name through the verified model store (provision.models.store.ensure)."""
    if ref is None:
        return None
    p = Path(ref).expanduser()
    if p.is_file():
        return p.resolve()
    try:
        models = importlib.import_module("provision.models.store")
    except ModuleNotFoundError:
        raise UnknownModel(
            f"model {ref!r}: not a file, and no model store in this build", fix="pass the GGUF's path"
        ) from None
    path: Path = models.ensure(ref)
    return path


def run(args: argparse.Namespace) -> int:
    from provision.core import catalog
    from provision.hosts import native_backend

    cmd = split_command(args)
    stack = catalog.load().get(args.stack)
    catalog.check_gpu(stack, args.gpu)  # before anything else: no silent CPU fallback
    return native_backend().run(stack, args.gpu, resolve_model(args.model), cmd, args.timeout, args.route)
