"""`provision run STACK [--gpu] [--route R] [--model NAME] [--timeout S] [--memory MIB] [--cpus N] -- CMD…`.

Thin dispatcher: the host backend for this platform (provision.hosts.native_backend)
does the work; GPU/route rules are the catalog's, so E007 is the same on every host.
Every guest is bounded: run time, memory and CPUs have defaults and are range-checked
(E003, provision/core/isolation.py) before anything starts.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

from provision.cli.output import command
from provision.core import isolation
from provision.core.errors import InvalidValue, UnknownModel, WrongPlatform

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "run": "run a command in a guest of STACK (podman machine on macOS, QEMU on Linux)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(
        sub,
        "run",
        COMMANDS["run"],
        "provision run llama-linux --gpu --model tiny-llama -- vulkaninfo --summary",
    )
    _options(p)
    p.add_argument("stack")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command to run in the guest")
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan (QEMU's command line), start nothing")
    p.add_argument("--gpu", action="store_true", help="give the guest the host GPU (E007 on a stack without GPU)")
    p.add_argument("--route", choices=("venus", "apir", "cpu"), default=None, help="default: the stack's route")
    p.add_argument("--model", default=None, help="a verified model (store name) or a GGUF path, mounted read-only")
    p.add_argument(
        "--timeout",
        type=float,
        default=isolation.DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"stop the guest after S seconds (default {isolation.DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument("--memory", type=int, default=None, metavar="MIB", help="guest memory (default: the route's)")
    p.add_argument("--cpus", type=int, default=None, metavar="N", help="guest CPUs (default: the route's)")
    p.add_argument(
        "--pids-limit",
        type=int,
        default=isolation.DEFAULT_PIDS,
        metavar="N",
        help=f"most processes in the container (macOS; default {isolation.DEFAULT_PIDS})",
    )


def split_command(args: argparse.Namespace) -> list[str]:
    """REMAINDER swallows options written after STACK (`run llama --gpu -- cmd`): parse them here."""
    rest = list(args.cmd)
    if "--" not in rest:
        return rest
    i = rest.index("--")
    opts, cmd = rest[:i], rest[i + 1 :]
    if opts:
        from provision.cli import Parser  # E003 for a bad late option, like every other argument error

        late = Parser(prog="provision run STACK", add_help=False)
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
    if p.exists():
        raise InvalidValue(f"--model {ref}: not a regular file", fix="give the path of a GGUF file, or a store name")
    if "/" in ref or ref.lower().endswith(".gguf"):
        raise UnknownModel(
            f"--model {ref}: no such file", fix="give the path of a GGUF file, or a store name (provision model list)"
        )
    try:
        models = importlib.import_module("provision.models.store")
    except ModuleNotFoundError:
        raise UnknownModel(
            f"model {ref!r}: not a file, and no model store in this build", fix="pass the GGUF's path"
        ) from None
    path: Path = models.ensure(ref)
    return path


def host_memory_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return None


def limits(args: argparse.Namespace) -> isolation.GuestLimits:
    asked = isolation.GuestLimits(memory_mib=args.memory, cpus=args.cpus, timeout_s=args.timeout, pids=args.pids_limit)
    return isolation.check_limits(asked, host_cpus=os.cpu_count() or 1, host_memory_mib=host_memory_mib())


def run(args: argparse.Namespace) -> int:
    from provision.core import catalog
    from provision.hosts import native_backend

    cmd = split_command(args)
    bounds = limits(args)
    stack = catalog.load().get(args.stack)
    catalog.check_gpu(stack, args.gpu)  # before anything else: no silent CPU fallback
    model = resolve_model(args.model)  # verified (or refused) before any VM starts
    backend = native_backend()
    backend.limits = bounds
    if args.dry_run:
        plan_run = getattr(backend, "plan_run", None)
        if plan_run is None:
            raise WrongPlatform("provision run --dry-run shows a Linux run's plan",
                                fix="on macOS, `provision launch --dry-run` shows the machine's plan")
        print(plan_run(stack, args.gpu, model, cmd, bounds.timeout_s, args.route).shell(), end="")
        return 0
    return backend.run(stack, args.gpu, model, cmd, bounds.timeout_s, args.route)
