"""`provision bench STACK`: llama-bench on the guest GPU, the guest CPU and the host; gate + table + JSON + PNG."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from provision.cli import bench_history
from provision.cli.output import command, dumps, table
from provision.core import values
from provision.core.errors import InvalidValue, VmFailed

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
                "provision bench run llama-linux --model tiny-llama --out out/bench")  # fmt: skip
    p.add_argument("stack")
    p.add_argument("--model", default="tiny-llama", help="store model name or GGUF path (default: tiny-llama)")
    p.add_argument("--timeout", type=float, default=900, help="seconds for the guest run (default 900)")
    p.add_argument("--out", type=Path, help="directory for the JSON and PNG (default: the cache's bench/)")
    p.add_argument("--no-host", action="store_true", help="skip the host-native baseline")
    p.add_argument("--venus-stack", default="llama-linux",
                   help="APIR stacks: the Venus stack benched in the same run for comparison (default llama-linux)")
    p.add_argument("--no-venus", action="store_true", help="APIR stacks: skip the Venus comparison")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)
    bench_history.register(actions)  # bench list, bench compare


def run(args: argparse.Namespace) -> int:
    from provision.apir import route as apir_route
    from provision.bench import report as bench
    from provision.cli.run import resolve_model
    from provision.core import catalog
    from provision.core.paths import cache_dir
    from provision.hosts.linux import backend as linux
    from provision.hosts.linux import bench as linux_bench

    values.seconds(args.timeout, "--timeout")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise InvalidValue(f"--out {args.out} is a file; it must name a directory", fix="name a directory with --out")
    stack = catalog.load().get(args.stack)
    catalog.check_gpu(stack, True)
    model = resolve_model(args.model)
    label = Path(args.model).name if Path(args.model).is_file() else args.model
    assert model is not None
    backend = linux.backend()
    apir = stack.route == "apir"
    places = apir_route.GUEST_BENCH_PLACES if apir else linux_bench.GUEST_PLACES
    runs = [(stack, places)]
    if apir and not args.no_venus:
        # The same model on the Venus route, in the same invocation: APIR vs Venus vs CPU vs host.
        venus = catalog.load().get(args.venus_stack)
        catalog.check_gpu(venus, True)
        runs.append((venus, {"guest-gpu": linux_bench.GUEST_PLACES["guest-gpu"]}))
    results: list[bench.BenchResult] = []
    outputs: list[str] = []  # raw llama-bench output, for the history's llama.cpp build
    res = None
    for run_stack, run_places in runs:
        res, out, err = linux.capture_run(
            backend, run_stack, True, model, linux_bench.guest_bench_command(run_places), args.timeout
        )
        if res.exit_status != 0:
            raise VmFailed(
                f"llama-bench in the {run_stack.name} guest exited {res.exit_status}: {err.strip()[-800:]}",
                fix=f"see {res.run_dir}",
            )
        outputs.append(out)
        sections = bench.split_sections(out)
        results += [r for where in run_places for r in bench.parse_llama_bench(where, sections.get(where, ""))]
    assert res is not None
    host_text = None if args.no_host else linux_bench.host_native_bench(model)
    if host_text is not None:
        results += bench.parse_llama_bench("host-native", host_text)
    gpu_where = "guest-apir" if apir else "guest-gpu"
    gate = bench.gate(results, gpu_where=gpu_where)
    out_dir = args.out or cache_dir("bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{stack.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    png = bench.plot(results, f"{stack.name} / {label}", out_dir / f"{stem}.png")
    data = bench.report(
        stack.name,
        label,
        results,
        gate,
        {
            "accel": res.accel,
            "guest_wall_s": round(res.wall_s, 1),
            "host_native": host_text is not None,
            "png": str(png) if png else None,
        },
        gpu_where=gpu_where,
    )
    json_path = bench.write_report(data, out_dir / f"{stem}.json")
    record = bench_history.record_bench(stack, model, label, {**data, "json": str(json_path)}, gpu_where, outputs)
    md = out_dir / f"{stem}.md"
    md.with_suffix(".md.partial").write_text(bench.markdown(data))
    md.with_suffix(".md.partial").rename(md)
    if args.json:
        print(dumps({**data, "json": str(json_path), "history": record}))
    else:
        print(table(bench.HEADERS, bench.rows(results)))
        ratio = data["remoting_ratio"]
        print(
            f"\ngate: pp guest GPU / guest CPU = {gate.factor:.2f}x (need >= {gate.required:g}x): "
            f"{'holds' if gate.holds else 'FAILS'}"
        )
        if ratio:
            print(f"remoting ratio ({gpu_where} / host native): " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
        if data.get("remoting_ratio_venus"):
            print("remoting ratio (guest Venus / host native): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in data["remoting_ratio_venus"].items()))
        else:
            print("remoting ratio: no host-native llama.cpp baseline")
        print(
            f"report: {json_path}"
            + (f"\nplot: {png}" if png else "\nplot: skipped (install the `plot` extra: matplotlib)")
        )
        print(f"history: record {record['id']} in {record['file']}")
    bench.check_gate(gate)
    return 0
