"""`provision run STACK [--gpu] [--model NAME] [--timeout S] -- CMD...`: one command in a guest."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .. import catalog
from ..errors import InvalidValue
from ..hosts import native_backend
from ..hosts.linux import LinuxBackend


def _add_options(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    sup = None if defaults else argparse.SUPPRESS
    p.add_argument(
        "--gpu",
        action="store_true",
        default=False if defaults else sup,
        help="give the guest the host GPU (E007 on a stack without GPU)",
    )
    p.add_argument("--route", default=sup, help="remoting route (default: the stack's)")
    model = p.add_mutually_exclusive_group()
    model.add_argument(
        "--model", default=sup, help="store model, read-only in the guest as /models/NAME.gguf (also $MODEL)"
    )
    model.add_argument("--model-file", type=Path, default=sup, help="a local GGUF file instead of a store model")
    p.add_argument("--timeout", type=float, default=sup, help="seconds until the guest is stopped (E021)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run one command in a guest of STACK (exit status = the command's)")
    p.add_argument("stack")
    _add_options(p)
    # REMAINDER keeps the guest command's own options away from argparse; options of ours
    # that come after STACK but before `--` are parsed out of it in run().
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p.set_defaults(func=run)


def split_command(args: argparse.Namespace) -> list[str]:
    rest = list(args.command)
    if "--" in rest:
        i = rest.index("--")
        ours, cmd = rest[:i], rest[i + 1 :]
        if ours:
            late = argparse.ArgumentParser(prog="provision run")
            _add_options(late, defaults=False)
            late.parse_args(ours, namespace=args)
    else:
        cmd = rest
    if not cmd:
        raise InvalidValue(
            "no command: give it after `--`, e.g. provision run llama-linux --gpu -- vulkaninfo --summary"
        )
    return cmd


def resolve_model(name: str | None, path: Path | None) -> Path | None:
    if path is not None:
        if not path.is_file():
            raise InvalidValue(f"--model-file = {str(path)!r}: no such file")
        return path
    if name is None:
        return None
    models = importlib.import_module("provision.models")
    return Path(models.ensure(name))


def run(args: argparse.Namespace) -> int:
    cmd = split_command(args)
    stack = catalog.load().get(args.stack)
    catalog.check_gpu(stack, args.gpu)  # E007 before anything else is looked at
    if args.timeout is not None and args.timeout <= 0:
        raise InvalidValue(f"--timeout = {args.timeout!r}: must be positive seconds")
    model = resolve_model(args.model, args.model_file)
    backend = native_backend(sys.platform)
    if isinstance(backend, LinuxBackend):
        # The guest sees a store model as /models/NAME.gguf (the store names blobs by hash).
        return backend.execute(stack, args.gpu, model, cmd, args.timeout, args.route, model_name=args.model).exit_status
    return backend.run(stack, args.gpu, model, cmd, args.timeout, args.route)
