"""`provision run STACK [--gpu] [--route R] [--model NAME] [--timeout S] [--memory MIB] [--cpus N] -- CMD…`.

Thin dispatcher: this machine's host (provision.hosts.native()) does the work; GPU/route rules
are the catalog's, so E007 is the same on every host.
Every guest is bounded: run time, memory and CPUs have defaults and are range-checked
(E003, provision/core/isolation.py) before anything starts.
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from provision.cli import routing
from provision.cli.model_word import model_word
from provision.cli.output import command
from provision.core import isolation
from provision.core.errors import InvalidValue, UnknownModel
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "run": "run a command in a guest of STACK, or `run MODEL` to serve a model and chat with it",
}
USAGE = "provision run [STACK] [--gpu] [--model M] -- CMD …, or provision run MODEL --gpu (serve it and chat)"


def register(sub: argparse._SubParsersAction) -> None:
    p = command(
        sub,
        "run",
        COMMANDS["run"],
        "provision run llama-linux --gpu --model tiny-llama -- vulkaninfo --summary",
        "provision run tiny-llama --gpu    # serve the model and chat with it; leaving the chat stops it",
        "provision run --gpu -- vulkaninfo --summary    # the stack for this host, and why",
        "provision run llama-linux --dry-run --json -- true    # the plan as data",
        json=True,
    )
    _options(p)
    # One REMAINDER: `run --gpu -- CMD` has no STACK, and a plain positional would take CMD's first word.
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="[STACK] -- CMD",
                   help="the stack (default: chosen for this host with --gpu/--route), then -- and the command")
    p.set_defaults(func=run)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the plan (QEMU's command line), start nothing")
    p.add_argument("--yes", "-y", dest="yes_build", action="store_true",
                   help="build the stack's image without asking when it is missing ($PROVISION_ASK_BUILDS=0)")
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
    routing.add_stack_option(p)
    p.add_argument(
        "--pids-limit",
        type=int,
        default=isolation.DEFAULT_PIDS,
        metavar="N",
        help=f"most processes in the container (macOS; default {isolation.DEFAULT_PIDS})",
    )


def split_command(args: argparse.Namespace) -> list[str]:
    """REMAINDER swallows options written after STACK (`run llama --gpu -- cmd`): parse them here."""
    rest = routing.take_positional(args, list(args.cmd))
    if "--" not in rest and not (rest and rest[0].startswith("-")):
        return rest
    # `run MODEL --gpu` has options and no command: all of it is options
    i = rest.index("--") if "--" in rest else len(rest)
    opts, cmd = rest[:i], rest[i + 1 :]
    if opts:
        from provision.cli import Parser  # E003 for a bad late option, like every other argument error

        late = Parser(prog="provision run STACK", add_help=False)
        _options(late)
        late.add_argument("--json", action="store_true")
        late.parse_args(opts, namespace=args)
    return cmd


def _model_reference(ref: str) -> bool:
    try:
        names = importlib.import_module("provision.models.names")
    except ModuleNotFoundError:
        return False
    return bool(names.is_reference(ref))


def resolve_model(ref: str | None, *, fetch: bool = True) -> Path | None:
    """A GGUF path as given, else a store name through the verified model store (provision.models.store.ensure).
    ``fetch=False`` (a dry run): where the store has it or will put it, nothing pulled, made or written."""
    if ref is None:
        return None
    p = Path(ref).expanduser()
    if p.is_file():
        return p.resolve()
    if p.exists():
        raise InvalidValue(f"--model {ref}: not a regular file", fix="give the path of a GGUF file, or a store name")
    if "://" not in ref and (ref.lower().endswith(".gguf") or ("/" in ref and not _model_reference(ref))):
        raise UnknownModel(
            f"--model {ref}: no such file", fix="give the path of a GGUF file, or a store name (provision model list)"
        )
    try:
        models = importlib.import_module("provision.models.store" if fetch else "provision.models.planned")
    except ModuleNotFoundError:
        raise UnknownModel(
            f"model {ref!r}: not a file, and no model store in this build", fix="pass the GGUF's path"
        ) from None
    path: Path = models.ensure(ref) if fetch else models.planned(ref)
    return path


def host_memory_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return None


def limits(args: argparse.Namespace) -> isolation.GuestLimits:
    asked = isolation.GuestLimits(memory_mib=args.memory, cpus=args.cpus, timeout_s=args.timeout, pids=args.pids_limit)
    return isolation.check_limits(asked, host_cpus=os.cpu_count() or 1, host_memory_mib=host_memory_mib())


def run(args: argparse.Namespace) -> Result | int:
    from provision import hosts
    from provision.core import catalog

    cmd = split_command(args)
    if not cmd:  # `run MODEL` serves and chats, as `ramalama run` does; `run STACK` alone is a usage error
        return serve_and_chat(args, model_word(args, USAGE))
    bounds = limits(args)
    stack = routing.stack_for(args, gpu=args.gpu, command="run")
    catalog.check_gpu(stack, args.gpu)  # before anything else: no silent CPU fallback
    model = resolve_model(args.model, fetch=not args.dry_run)  # verified (or refused) before any VM starts
    req = hosts.RunRequest(stack, args.gpu, tuple(cmd), limits=bounds, model_path=model, route=args.route)
    if args.dry_run:  # the plan as data (what starts, as whom, where, with which environment); nothing starts
        return plan_result(hosts.native().plan_run(req))
    return hosts.native().run(req).exit_status


def plan_result(plan: Mapping[str, Any]) -> Result:
    """A dry run's plan: the data for ``--json``, the shell lines for a person."""
    return Result(dict(plan), str(plan.get("shell", "")))


def serve_and_chat(args: argparse.Namespace, model: str) -> Result | int:
    """`provision run MODEL`: serve MODEL (the stack picked as serve picks it) on a free loopback port,
    chat with it on this terminal, stop it when the chat ends (EOF, /bye, Ctrl-C or an error)."""
    from provision.cli import build_parser

    port = _free_port()
    serve_argv = ["serve", "--model", model, "--port", str(port)]
    serve_argv += ["--gpu"] if args.gpu else []
    serve_argv += ["--route", args.route] if args.route else []
    serve_argv += ["--stack", args.stack_option] if args.stack_option else []
    serve_argv += ["--dry-run"] if args.dry_run else ["--detach"]
    serve_args = build_parser("serve", full=False).parse_args(serve_argv)
    serve_args.app = args.app
    serve_args.ends = "leaving the chat (/exit or Ctrl-D) stops it"
    started = serve_args.func(serve_args)
    if args.dry_run:  # the serve's plan; the chat starts nothing of its own
        assert isinstance(started, Result)
        return Result({**dict(started.data), "then": "chat, stop"}, started.text)
    from provision.serve import state as serve_state

    assert isinstance(started, Result)
    name = str(started.data["name"])
    try:
        chat_args = build_parser("chat", full=False).parse_args(["chat", name])
        chat_args.app = args.app
        chat_args.func(chat_args)
    finally:
        serve_state.stop(serve_state.find(name))
        args.app.say("serve")(f"provision: stopped {name}")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
