"""`provision serve`, `provision ps`, `provision stop`, `provision shell`.

Thin: checks that need no guest come first (E007, address, port, name), then provision.serve
or provision.shell does the work. `serve --detach` starts this same command again as a
supervisor in the background (hidden ``--report FILE``) and returns once it reports healthy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from provision.cli import output, routing, serve_generate
from provision.cli.model_word import model_word
from provision.cli.output import command, table
from provision.cli.run import plan_result, resolve_model
from provision.cli.serve_model import apply_defaults, model_defaults
from provision.core.errors import InvalidValue, ProvisionError
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.core.catalog import Stack
    from provision.serve.engine import ServeRequest, ServerOptions


# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "serve": "serve a model with llama-server (OpenAI-compatible) from a guest, on this host's loopback",
    "ps": "list what `provision serve` runs",
    "stop": "stop a served model (and its guest)",
    "shell": "an interactive shell in a guest of STACK (same devices and env as run)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "serve", COMMANDS["serve"], "provision serve tiny-llama --gpu --detach",
                "provision serve llama-linux --model tiny-llama --gpu --generate quadlet --output llama.container",
                json=True)
    p.add_argument("stack", nargs="?", metavar="STACK|MODEL",
                   help="a stack (default: chosen for this host with --gpu/--route, the why is printed), or the "
                        "model to serve as RamaLama takes it (then no --model)")  # fmt: skip
    routing.add_stack_option(p)
    p.add_argument("--model", default=None, help="a verified model (store name) or a GGUF path")
    p.add_argument("--gpu", action="store_true", help="all layers on the stack's GPU device (E007 without GPU)")
    p.add_argument("--route", choices=("venus", "apir", "cpu"), default=None, help="default: the stack's route")
    p.add_argument("--yes", "-y", dest="yes_build", action="store_true",
                   help="build the stack's image without asking when it is missing ($PROVISION_ASK_BUILDS=0)")
    p.add_argument("--port", type=int, default=8080, help="host port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="host address to publish on (default 127.0.0.1)")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host beyond loopback (no auth!)")
    p.add_argument("--ctx-size", "--ctx", dest="ctx", type=int, default=None,
                   help="context size in tokens (default: the model's)")
    server_options(p)
    p.add_argument("--parallel", type=int, default=4, help="concurrent request slots (default 4)")
    p.add_argument("--name", default=None, help="name for ps/stop (default STACK-PORT)")
    p.add_argument("--wait", type=float, default=900.0, metavar="S", help="health deadline from boot (default 900)")
    p.add_argument("--detach", action="store_true", help="return once healthy; `provision stop NAME` ends it")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what would start), start nothing")
    p.add_argument("--report", default=None, help=argparse.SUPPRESS)
    serve_generate.options(p)  # --generate systemd|quadlet|kube --target HOST --output FILE [--force]
    p.set_defaults(func=serve_cmd)

    p = command(sub, "ps", COMMANDS["ps"], "provision ps --json", json=True)
    p.set_defaults(func=ps_cmd)

    p = command(sub, "stop", COMMANDS["stop"], "provision stop llama-linux-8080", json=True)
    p.add_argument("name", nargs="?", help="a name `provision ps` lists")
    p.add_argument("--all", action="store_true", help="stop every served model")
    p.set_defaults(func=stop_cmd)

    p = command(sub, "shell", COMMANDS["shell"], "provision shell llama-linux --gpu --model tiny-llama",
                "provision shell llama-linux --dry-run --json", json=True)
    p.add_argument("stack")
    p.add_argument("--gpu", action="store_true", help="give the guest the host GPU (E007 on a stack without GPU)")
    p.add_argument("--route", choices=("venus", "apir", "cpu"), default=None, help="default: the stack's route")
    p.add_argument("--model", default=None, help="mounted read-only, path in $MODEL")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="stop the guest after S seconds")
    p.add_argument("--dry-run", action="store_true", help="print the plan (what would start), start nothing")
    p.set_defaults(func=shell_cmd)


def server_options(p: argparse.ArgumentParser) -> None:
    """llama-server's own options (provision.serve.engine.ServerOptions), each passed as one argument."""
    p.add_argument("--temp", type=float, default=None, help="default sampling temperature (0-5)")
    p.add_argument("--ngl", type=int, default=None, metavar="N", help="with --gpu: layers on the GPU (default all)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads llama-server uses")
    p.add_argument("--embeddings", action="store_true", help="serve /v1/embeddings too")
    p.add_argument("--runtime-args", default=None, metavar="ARGS",
                   help="more llama-server options, one string split into words (never run by a shell)")


def _stack(args: argparse.Namespace) -> Stack:
    from provision.core import catalog

    stack = routing.stack_for(args, gpu=args.gpu, command=args.command)
    catalog.check_gpu(stack, args.gpu)  # before anything else: no silent CPU fallback
    catalog.check_route(stack, args.route)
    return stack


def serve_request(
    args: argparse.Namespace, stack: Stack, host: str, name: str, options: ServerOptions, *, fetch: bool = True
) -> ServeRequest:
    """What serve runs: the model (fetched when it must be) with its own defaults under the user's flags.
    ``fetch=False`` (a dry run): the model where the store has it or will put it, nothing pulled or written."""
    from provision.serve import engine as serving

    model_path = resolve_model(args.model, fetch=fetch)
    assert model_path is not None  # --model is required
    present = fetch or model_path.is_file()  # a dry run of a model not made yet: its defaults come with it
    if present:
        serving.check_parts(model_path)
    found = model_defaults(args.model, model_path) if present else None
    return serving.ServeRequest(
        stack=stack,
        model_path=model_path,
        model=serving.model_alias(args.model, model_path),
        gpu=args.gpu,
        host=host,
        port=args.port,
        ctx=args.ctx if args.ctx is not None or found is None else found.ctx,
        parallel=args.parallel,
        name=name,
        wait_s=args.wait,
        route=args.route,
        options=apply_defaults(options, found) if found is not None else options,
    )


SERVE_USAGE = "provision serve [STACK] --model M [--gpu], or provision serve MODEL [--gpu]"


def serve_cmd(args: argparse.Namespace) -> Result | int:
    from provision import hosts
    from provision.serve import engine as serving
    from provision.serve import state as serve_state

    if args.model is None:  # `serve MODEL`, as `ramalama serve MODEL`
        args.model = model_word(args, SERVE_USAGE)
    stack = _stack(args)
    host = serving.check_host(args.host, args.allow_remote)
    serving.check_numbers(args.port, args.ctx, args.parallel)
    options = serving.check_options(serving.ServerOptions(
        temp=args.temp, ngl=args.ngl, threads=args.threads, embeddings=args.embeddings,
        runtime_args=serving.split_runtime_args(args.runtime_args)), args.gpu)  # fmt: skip
    name = serve_state.check_name(args.name) if args.name else serving.default_name(stack, args.port)
    if args.generate:
        return serve_generate.run(args, stack, host, name, options)
    if args.dry_run:
        return plan_result(hosts.native().plan_serve(serve_request(args, stack, host, name, options, fetch=False)))
    if args.detach:
        return _detach(args, stack, host, name, options)
    report = Path(args.report) if args.report else None
    try:
        serving.check_port_free(host, args.port)
        req = serve_request(args, stack, host, name, options)

        def ready(entry: serve_state.Entry) -> None:
            if report is not None:
                serve_state.write_report(report, {"entry": entry.as_dict()})
            output.line(entry.url)
            args.app.say("serve")(f"provision: serving {req.model} as {name} at {entry.url}/v1 (Ctrl-C stops)")

        log = str(serve_state.state_dir() / f"{name}.log") if report else None
        guest = hosts.native().serve_guest(req, out=sys.stdout.buffer, err=sys.stderr.buffer)
        return serving.serve(req, guest, log=log, on_ready=ready)
    except ProvisionError as exc:
        if report is not None:
            serve_state.write_report(report, {"error": exc.as_dict()})
        raise


def _detach(args: argparse.Namespace, stack: Stack, host: str, name: str, options: ServerOptions) -> Result:
    from provision.serve import engine as serving
    from provision.serve import state as serve_state

    serving.check_port_free(host, args.port)  # first: the default name comes from the port
    for entry in serve_state.entries():
        if entry.name == name:
            raise InvalidValue(
                f"a serve named {name!r} already runs ({entry.url})",
                fix=f"--name OTHER, or provision stop {name}",
            )
    resolve_model(args.model)  # pulls or synthesizes here, with progress, not in the background
    state = serve_state.state_dir()
    log, report = state / f"{name}.log", state / f".{name}.report.json"
    report.unlink(missing_ok=True)
    argv = [
        "serve", stack.name, "--model", args.model, "--port", str(args.port), "--host", host,
        "--parallel", str(args.parallel), "--name", name, "--wait", str(args.wait), "--report", str(report),
    ]  # fmt: skip
    argv += ["--gpu"] if args.gpu else []
    argv += ["--allow-remote"] if args.allow_remote else []
    argv += ["--ctx", str(args.ctx)] if args.ctx is not None else []
    argv += ["--route", args.route] if args.route else []
    argv += options.serve_argv()
    args.app.say("serve")(f"provision: starting {name} in the background (log: {log})")
    proc = serve_state.spawn_supervisor(argv, log)
    try:
        data = serve_state.wait_report(proc, report, log)
    except KeyboardInterrupt:
        serve_state.stop_supervisor(proc)  # it stops its guest as on Ctrl-C
        raise
    finally:
        report.unlink(missing_ok=True)
    entry = data["entry"]
    ends = getattr(args, "ends", None) or f"`provision stop {name}` ends it"  # run MODEL: the chat's end
    args.app.say("serve")(f"provision: {name} is healthy at {entry['url']}/v1; {ends}")
    return Result(entry, entry["url"])


def ps_cmd(args: argparse.Namespace) -> Result:
    from provision.serve import state as serve_state

    found = serve_state.entries()
    rows = [(e.name, e.stack, e.model, "yes" if e.gpu else "no", e.url, str(e.pid), e.status,
             f"{int(time.time() - e.started)}s") for e in found]  # fmt: skip
    return Result([e.as_dict() for e in found],
                  lambda: table(["NAME", "STACK", "MODEL", "GPU", "URL", "PID", "STATUS", "UP"], rows))  # fmt: skip


def stop_cmd(args: argparse.Namespace) -> Result:
    from provision.serve import state as serve_state

    if args.all == bool(args.name):
        raise InvalidValue("provision stop: give a NAME or --all (not both)", fix="provision ps lists the names")
    targets = serve_state.entries() if args.all else [serve_state.find(args.name)]
    done = [{"name": entry.name, "clean": serve_state.stop(entry)} for entry in targets]
    how = {True: "stopped", False: "killed (did not stop within the grace time)"}
    return Result(done, "\n".join(f"{d['name']}: {how[bool(d['clean'])]}" for d in done))


def shell_cmd(args: argparse.Namespace) -> Result | int:
    from provision import hosts
    from provision.serve import engine as serving

    stack = _stack(args)
    model_path = resolve_model(args.model, fetch=not args.dry_run)
    model_name = f"{serving.model_alias(args.model, model_path)}.gguf" if model_path and args.model else None
    req = hosts.RunRequest(stack, args.gpu, (), model_path=model_path, model_name=model_name, route=args.route,
                           timeout_s=args.timeout)  # fmt: skip
    if args.dry_run:
        return plan_result(hosts.native().plan_shell(req))
    return hosts.native().shell(req)
