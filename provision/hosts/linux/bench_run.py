"""`provision bench` on Linux: llama-bench in the guest (GPU, CPU; APIR beside Venus) and on the host.

Writes the report as JSON, Markdown and (with matplotlib) a PNG, each whole, and returns it; the
gate (pp guest GPU >= 2x guest CPU) is the CLI's to enforce after printing (E025).
"""

from __future__ import annotations

import time

from provision.apir import route as apir_route
from provision.bench import report as bench
from provision.core import catalog
from provision.core.errors import VmFailed
from provision.hosts import BenchRequest, RunRequest
from provision.hosts.linux import bench as linux_bench
from provision.hosts.linux import execute


def run(req: BenchRequest) -> bench.BenchRun:
    stack = req.stack
    catalog.check_gpu(stack, True)
    apir = stack.route == "apir"
    places = apir_route.GUEST_BENCH_PLACES if apir else linux_bench.GUEST_PLACES
    runs = [(stack, places)]
    if apir and req.venus_stack is not None:
        # The same model on the Venus route, in the same invocation: APIR vs Venus vs CPU vs host.
        catalog.check_gpu(req.venus_stack, True)
        runs.append((req.venus_stack, {"guest-gpu": linux_bench.GUEST_PLACES["guest-gpu"]}))
    results: list[bench.BenchResult] = []
    outputs: list[str] = []  # raw llama-bench output, for the history's llama.cpp build
    res = None
    for run_stack, run_places in runs:
        res, out, err = execute.run_captured(RunRequest(
            run_stack, True, tuple(linux_bench.guest_bench_command(run_places)), model_path=req.model_path,
            timeout_s=req.timeout_s,
        ))
        if res.exit_status != 0:
            raise VmFailed(
                f"llama-bench in the {run_stack.name} guest exited {res.exit_status}: {err.strip()[-800:]}",
                fix=f"see {res.run_dir}",
            )
        outputs.append(out)
        sections = bench.split_sections(out)
        results += [r for where in run_places for r in bench.parse_llama_bench(where, sections.get(where, ""))]
    assert res is not None
    host_text = linux_bench.host_native_bench(req.model_path) if req.host_baseline else None
    if host_text is not None:
        results += bench.parse_llama_bench("host-native", host_text)
    gpu_where = "guest-apir" if apir else "guest-gpu"
    gate = bench.gate(results, gpu_where=gpu_where)
    req.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{stack.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    png = bench.plot(results, f"{stack.name} / {req.label}", req.out_dir / f"{stem}.png")
    data = bench.report(
        stack.name,
        req.label,
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
    json_path = bench.write_report(data, req.out_dir / f"{stem}.json")
    md = bench.write_markdown(data, req.out_dir / f"{stem}.md")
    return bench.BenchRun({**data, "json": str(json_path), "markdown": str(md)}, results, gate, outputs)
