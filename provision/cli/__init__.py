"""The thin command line: parse, call one domain function, print, map errors to exit codes.

Each command group lives in its own module with ``register(subparsers)``; the handler it
sets returns a ``provision.core.result.Result`` (or a bare exit status for commands whose
output is a guest's stream), and ``output.emit`` prints it: text, or with ``--json`` one
envelope ``{"command", "status", "data", "error"}``. ``main`` builds the settings once
(provision/core/settings.py), sets up logging (``-v``/``-q``, a log file per invocation) and
hands the command's context down as ``args.app`` (provision/core/app.py: the settings and the
display); it never writes ``os.environ``, and only ``output`` prints. Errors are ProvisionError subclasses
(provision/core/errors.py): each prints ``E0NN: message`` and a ``fix:`` line (with ``--json``,
the same envelope with status "error" on stdout). Argument errors are E003. Anything else is a
bug: a short report, the traceback in a file, exit status ``errors.INTERNAL_ERROR_STATUS``;
never a traceback on the terminal.

May import: adapters, api, apir, bench, chat, core, doctor, hosts, images, models, routes, serve; never hosts.linux or
hosts.darwin (a host is reached through the registry, ``hosts.native()``/``hosts.get()``);
nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from provision.cli import output
from provision.core import log
from provision.core.errors import INTERNAL_ERROR_STATUS, InvalidValue, ProvisionError

# Order is the order shown in --help. Command modules import nothing heavy at the top:
# their handlers import the domain they call, so `provision --help` starts fast.
# Each module's words are its COMMANDS' keys (tests/cli/test_command_face.py holds them equal):
# they let a named command import its own module and no other.
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "stacks": ("stacks",), "image": ("image",), "model": ("model",),
    "aliases": ("pull", "list", "rm", "inspect", "info", "version"), "host_tools": ("host-tools",),
    "launch": ("launch",), "run": ("run",), "serve": ("serve", "ps", "stop", "shell"), "chat": ("chat",),
    "bench": ("bench",), "perplexity": ("perplexity",), "doctor": ("doctor",), "ggml": ("ggml",),
    "apir": ("apir",), "api": ("api",), "config": ("config",), "completion": ("completion",),
}  # fmt: skip

DESCRIPTION = """\
GPU llama.cpp in Linux guests, from the host's GPU.

provision builds guest images, fetches sha256-verified models, and starts guests that
reach the host GPU: on macOS a podman machine with krunkit (Venus -> MoltenVK -> Metal,
or APIR -> ggml-metal); on Linux QEMU + virglrenderer (Venus -> the host's Vulkan driver,
or APIR -> a host ggml backend). No silent CPU fallback: asking for a GPU on a stack
without one is refused (E007) before anything starts."""

QUICK_START = """\
quick start (Linux):
  sudo provision host-tools                      # QEMU + virglrenderer in a cached chroot
  sudo provision image llama-linux               # build the guest image
  provision model synth tiny-llama               # a small real GGUF, made offline
  sudo provision run llama-linux --gpu --model tiny-llama -- vulkaninfo --summary
  provision run tiny-llama --gpu                 # serve it and chat, as `ramalama run` does
quick start (macOS):
  nix profile add .#krun && provision image llama && provision launch
  provision run llama --gpu --model tiny-llama -- llama-bench -m "$MODEL" -dev Vulkan0

`provision COMMAND --help` shows each command's options and an example."""

# Commands with actions: the envelope names them with their action ("model pull").
GROUPS = ("image", "model", "bench", "ggml", "apir", "config")

# `provision image STACK` is the design card's short form of `provision image build STACK`;
# `provision bench STACK` of `provision bench run STACK`.
IMAGE_ACTIONS = ("render", "build")
BENCH_ACTIONS = ("run", "list", "compare")
SHORT_FORMS = {"image": ("build", IMAGE_ACTIONS), "bench": ("run", BENCH_ACTIONS)}


def expand_short_forms(argv: list[str]) -> list[str]:
    if len(argv) >= 2 and argv[0] in SHORT_FORMS and not argv[1].startswith("-"):
        default, actions = SHORT_FORMS[argv[0]]
        if argv[1] not in actions:
            return [argv[0], default, *argv[1:]]
    # `provision bench` alone (or with options only) benches the stack chosen for this host
    if argv[:1] == ["bench"] and (len(argv) == 1 or (argv[1].startswith("-") and argv[1] not in ("-h", "--help"))):
        return ["bench", "run", *argv[1:]]
    return argv


class Parser(argparse.ArgumentParser):
    """argparse that raises E003 instead of printing usage and exiting 2 (sub-parsers inherit it)."""

    def error(self, message: str) -> NoReturn:
        fix = f"see `{self.prog} --help` for what it takes"
        choice = _INVALID_CHOICE.search(message)
        if choice:  # a mistyped command: the nearest ones, and the model action a top-level word may mean
            from provision.core.suggest import did_you_mean

            hint = did_you_mean(choice["word"], re.findall(r"'([^']*)'", choice["known"]))
            fix = f"{hint} (see `{self.prog} --help`)" if hint else fix
        raise InvalidValue(f"{self.prog}: {message}", fix=fix)


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<known>.*)\)")


def build_parser(command: str | None = None, *, full: bool = True) -> argparse.ArgumentParser:
    """The parser; with ``full=False`` only ``command`` is built and only its module imported, so a
    command's start-up imports only what its parser needs. With no command, or one that is not a
    command, every command gets a one-line entry (for --help, and for argparse to name the choices)."""
    parser = Parser(
        prog="provision",
        description=DESCRIPTION,
        epilog=QUICK_START,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.import_module('provision').__version__}"
    )
    output.verbosity_flags(parser, default=None)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="a setting for this command, over the config files and PROVISION_* "
                        "(`provision config show` lists the keys)")  # fmt: skip
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = [name for name, words in COMMAND_MODULES.items() if command in words]
    for name in COMMAND_MODULES if full or not named else named:
        module = importlib.import_module(f"{__name__}.{name}")
        if full or command in module.COMMANDS:
            module.register(sub)
        else:
            for entry, help_text in module.COMMANDS.items():
                sub.add_parser(entry, help=help_text)
    return parser


# Options of the root parser that take a value: the word after them is not a command.
ROOT_VALUE_OPTIONS = ("--set",)


def _words(argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` that are not options (nor an option's value), up to ``--``."""
    words, skip = [], False
    for a in argv:
        if a == "--":
            break
        if skip:
            skip = False
        elif a in ROOT_VALUE_OPTIONS:
            skip = True
        elif not a.startswith("-"):
            words.append(a)
    return words


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option), if any."""
    return next(iter(_words(argv)), None)


def _wants_json(argv: Sequence[str]) -> bool:
    head = list(argv)[: list(argv).index("--")] if "--" in argv else list(argv)
    # `--format json` (bench list/compare, perplexity) is the same envelope as `--json`
    formats = [b for a, b in zip(head, head[1:], strict=False) if a == "--format"]
    return "--json" in head or "--format=json" in head or "json" in formats


def _crash_report(exc: BaseException) -> Path | None:
    """Write the traceback where the user can find it; the cache may be the very thing that is broken."""
    import tempfile  # only on the rare path of a bug: start-up stays light
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    name = f"provision-crash-{time.strftime('%Y%m%d-%H%M%S')}-{id(exc):x}.txt"
    for where in (_crash_dir, lambda: Path(tempfile.gettempdir())):
        try:
            path = where() / name
            path.write_text(f"argv: {sys.argv!r}\n{text}", encoding="utf-8")
            return path
        except Exception:  # noqa: BLE001, S112 - try the next place
            continue
    return None


def _crash_dir() -> Path:
    from provision.core import paths

    return paths.cache_dir("crash")


def _command_path(argv: Sequence[str]) -> str:
    """The command as the envelope names it ("model pull") when parsing did not get that far."""
    words = _words(argv)
    return " ".join(words[:2] if words[:1] and words[0] in GROUPS else words[:1]) or "provision"


def entry() -> NoReturn:
    """The ``provision`` program (console script and ``python -m provision``): main(), then leave.

    It leaves without the interpreter's teardown of every module, which took 15-20 ms of a
    130 ms ``model pull`` here (a fifth of its start-up; measured against ``sys.exit`` in the
    same minutes). Nothing of ours waits for that teardown: every file a command writes is
    closed, synced and renamed before main() returns. What the interpreter would still do at
    exit is done here, in its order: wait for threads that are not daemons, run the atexit
    callbacks (logging's shutdown, weakref finalizers such as temporary directories), flush
    stdout and stderr.
    """
    try:
        status = main()
    except SystemExit as exc:  # --help, --version
        code = exc.code
        if isinstance(code, str):
            output.error_line(code)
        status = code if isinstance(code, int) else (0 if code is None else 1)
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # the reader went away: 141, as main() says it
            status = 141 if stream is sys.stdout else status
        except (OSError, ValueError):  # as the interpreter does when stdout cannot be flushed
            status = 120 if stream is sys.stdout else status
    os._exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (provision completion SHELL)
        from provision.cli import completion

        completion.complete_if_asked(build_parser)
    argv = expand_short_forms(list(sys.argv[1:] if argv is None else argv))
    want_json = _wants_json(argv)
    command = _command_path(argv)
    from provision.adapters import signals

    signals.stop_on_signals()  # SIGTERM/SIGHUP unwind like Ctrl-C: children stopped, exit 128+N
    try:
        args = build_parser(_command_of(argv), full=False).parse_args(argv)
        want_json = want_json or bool(getattr(args, "json", False))
        command = getattr(args, "command_name", command)
        return _dispatch(args, command, want_json, argv)
    except ProvisionError as exc:
        if want_json:
            output.emit_error(command, exc.as_dict())
        output.error_line(exc.render())
        return exc.exit_status
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: 128 + the signal's number
        output.error_line(f"interrupted ({str(exc) or 'SIGINT'})")
        return signals.exit_status(exc)
    except SystemExit:
        raise  # --help and --version
    except BrokenPipeError:  # the reader went away (`provision … | head`): not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's final flush quiet
        return 141
    except Exception as exc:  # noqa: BLE001 - the one place that turns a bug into a report
        where = _crash_report(exc)
        detail = f"details: {where}" if where else "no place to write details was writable"
        message = f"internal error: {type(exc).__name__}: {exc}"
        if want_json:
            output.emit_error(command, {"code": "internal", "message": message, "fix": "report it with that file",
                                        "details": str(where) if where else None,
                                        "exit_status": INTERNAL_ERROR_STATUS})  # fmt: skip
        output.error_line(f"{message}\n  {detail}\n  fix: this is a bug in provision; report it with that file")
        return INTERNAL_ERROR_STATUS
    finally:
        log.close()


def _dispatch(args: argparse.Namespace, command: str, want_json: bool, argv: Sequence[str]) -> int:
    """Build the command's context once (the settings from defaults, files, environment and flags;
    the display at its verbosity), open the log, run the handler with it, render."""
    import logging

    from provision.core import paths
    from provision.core import settings as settings_mod
    from provision.core.app import App

    flags = [*(getattr(args, "set", None) or ())]
    if getattr(args, "yes_build", False):  # run/serve/bench --yes: a missing image is built unasked
        flags.append("ask_builds=0")
    settings = settings_mod.load(flags=flags)
    app = App(settings, verbose=getattr(args, "verbose", 0) or 0, quiet=bool(getattr(args, "quiet", False)))
    args.app = app
    # Handlers hand ``app.settings`` down. ``installed`` is for what runs below a caller that has no
    # settings to hand (current()'s fallback); the programs started get a file's or a flag's value
    # as its PROVISION_* variable from the runner (``Settings.environ``), os.environ stays as it is.
    with settings_mod.installed(settings):
        where = log.setup(app.verbose, app.quiet, paths.state_dir("logs", settings), command)
        logging.getLogger("provision.cli").debug("provision %s (log %s)", shlex.join(argv), where)
        return output.emit(command, args.func(args), as_json=want_json)
