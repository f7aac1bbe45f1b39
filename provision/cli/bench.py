"""`provision bench STACK`: llama-bench on the guest GPU, the guest CPU and the host; gate + table + JSON + PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli import bench_history, routing
from provision.cli.output import command, table
from provision.core import values
from provision.core.errors import BenchGateFailed, InvalidValue
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "bench": "benchmark a GPU stack: guest GPU vs guest CPU (gate: pp >= 2x) vs host native",
}


def register(sub: argparse._SubParsersAction) -> None:
    group = command(sub, "bench", COMMANDS["bench"],
                    "provision bench llama-linux --model tiny-llama    (short for: bench run llama-linux ...)",
                    "provision bench list", "provision bench compare -2 -1")  # fmt: skip
    actions = group.add_subparsers(dest="bench_command", metavar="ACTION", required=True)
    p = command(actions, "run", "run the benchmark (each run is added to the bench history)",
                "provision bench run llama-linux --model tiny-llama --out out/bench", json=True)  # fmt: skip
    p.add_argument("stack", nargs="?", help="default: the GPU stack chosen for this host (the why is printed)")
    routing.add_stack_option(p)
    p.add_argument("--yes", "-y", dest="yes_build", action="store_true",
                   help="build the stack's image without asking when it is missing ($PROVISION_ASK_BUILDS=0)")
    p.add_argument("--model", default="tiny-llama", help="store model name or GGUF path (default: tiny-llama)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the guest run (default 900)")
    p.add_argument("--out", type=Path, help="directory for the JSON and PNG (default: the cache's bench/)")
    p.add_argument("--no-host", action="store_true", help="skip the host-native baseline")
    p.add_argument("--venus-stack", default="llama-linux",
                   help="APIR stacks: the Venus stack benched in the same run for comparison (default llama-linux)")
    p.add_argument("--no-venus", action="store_true", help="APIR stacks: skip the Venus comparison")
    p.set_defaults(func=run)
    bench_history.register(actions)  # bench list, bench compare


def run(args: argparse.Namespace) -> Result:
    from provision import hosts
    from provision.bench import report as bench
    from provision.cli.run import resolve_model
    from provision.core import catalog
    from provision.core.paths import cache_dir

    values.seconds(args.timeout, "--timeout")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise InvalidValue(f"--out {args.out} is a file; it must name a directory", fix="name a directory with --out")
    host = hosts.native()  # a host that cannot bench says so (E033) in its bench()
    stack = routing.stack_for(args, gpu=True, command="bench")
    catalog.check_gpu(stack, True)
    venus = catalog.load().get(args.venus_stack) if stack.route == "apir" and not args.no_venus else None
    model = resolve_model(args.model)
    assert model is not None
    label = Path(args.model).name if Path(args.model).is_file() else args.model
    out = args.out or cache_dir("bench", settings=args.app.settings)
    req = hosts.BenchRequest(stack, model, label, args.timeout, out,
                             host_baseline=not args.no_host, venus_stack=venus)  # fmt: skip
    done = host.bench(req)
    gate = done.gate
    gpu_where = "guest-apir" if stack.route == "apir" else "guest-gpu"
    record = bench_history.record_bench(stack, model, label, done.data, gpu_where, done.outputs)
    data = {**done.data, "history": record}

    def text() -> str:
        lines = [table(bench.HEADERS, bench.rows(done.results))]
        lines.append(f"\ngate: pp guest GPU / guest CPU = {gate.factor:.2f}x (need >= {gate.required:g}x): "
                     f"{'holds' if gate.holds else 'FAILS'}")  # fmt: skip
        ratio = data["remoting_ratio"]
        if ratio:
            lines.append(f"remoting ratio ({gpu_where} / host native): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))  # fmt: skip
        if data.get("remoting_ratio_venus"):
            lines.append("remoting ratio (guest Venus / host native): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in data["remoting_ratio_venus"].items()))  # fmt: skip
        if not ratio:  # (a Venus-only run has no Venus-beside-APIR ratio, and that is no missing baseline)
            lines.append("remoting ratio: no host-native llama.cpp baseline")
        png = data.get("png")
        lines.append(f"report: {data['json']}" + (f"\nplot: {png}" if png else
                     "\nplot: skipped (install the `plot` extra: matplotlib)"))  # fmt: skip
        lines.append(f"history: record {record['id']} in {record['file']}")
        return "\n".join(lines)

    error = None
    try:
        bench.check_gate(gate)
    except BenchGateFailed as exc:
        error = exc
    return Result(data, text, error=error)
