"""`provision bench` on Linux: llama-bench in guests (GPU, CPU; APIR beside Venus) and on the host.

The guest command runs llama-bench once per place (GPU device, CPU) after a section marker that
bench.report splits on; the host run uses the host-tools tree's own llama-bench. ``run`` writes the
report as JSON, Markdown and (with matplotlib) a PNG, each whole, and returns it; the gate (pp guest
GPU >= 2x guest CPU) is the CLI's to enforce after printing (E025).
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path

from provision.adapters import runner
from provision.apir import route as apir_route
from provision.bench import report
from provision.core import catalog
from provision.core.errors import VmFailed
from provision.hosts import BenchRequest, RunRequest
from provision.hosts.linux.run import execute
from provision.hosts.linux.run.runplan import IN_CHROOT
from provision.hosts.linux.tools import host_tools

BENCH_ARGS = ("-p", "256", "-n", "16", "-r", "2", "-o", "json")


def guest_bench_command(device_args: Mapping[str, tuple[str, ...]]) -> list[str]:
    """One guest command running llama-bench once per place, each after a section marker."""
    parts = ["set -e"]
    for where, dev in device_args.items():
        parts.append(f"echo '@@krun-bench {where}'")
        parts.append(
            shlex.join(["llama-bench", "-m", "MODEL_PATH", *dev, *BENCH_ARGS]).replace("MODEL_PATH", '"$MODEL"')
        )
    return ["sh", "-c", "; ".join(parts)]


GUEST_PLACES = {
    "guest-gpu": ("-dev", "Vulkan0", "-ngl", "99"),
    "guest-cpu": ("-dev", "none", "-ngl", "0"),
}


def host_native_bench(model: Path, timeout: float = 600) -> str | None:
    """llama-bench on the host's own Vulkan device (in the host-tools tree), or None without llama.cpp there."""
    tools = host_tools.locate()
    if tools is None or not tools.path("usr/bin/llama-bench").exists():
        return None
    program = ["llama-bench", "-m", f"{IN_CHROOT['model']}/{model.name}", "-dev", "Vulkan0", "-ngl", "99", *BENCH_ARGS]
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    if tools.is_chroot:
        argv = tools.chroot().with_binds({model.resolve().parent: IN_CHROOT["model"]}).argv(program, env)
    else:
        program[2] = str(model)
        argv = program
    done = runner.run(argv, name="llama-bench", timeout=timeout, env=None if tools.is_chroot else {**os.environ, **env})
    if done.status != 0:
        raise VmFailed(f"host llama-bench failed ({done.status}): {done.err.strip()[-500:]}")
    return done.out



def run(req: BenchRequest) -> report.BenchRun:
    stack = req.stack
    catalog.check_gpu(stack, True)
    apir = stack.route == "apir"
    places = apir_route.GUEST_BENCH_PLACES if apir else GUEST_PLACES
    runs = [(stack, places)]
    if apir and req.venus_stack is not None:
        # The same model on the Venus route, in the same invocation: APIR vs Venus vs CPU vs host.
        catalog.check_gpu(req.venus_stack, True)
        runs.append((req.venus_stack, {"guest-gpu": GUEST_PLACES["guest-gpu"]}))
    results: list[report.BenchResult] = []
    outputs: list[str] = []  # raw llama-bench output, for the history's llama.cpp build
    res = None
    for run_stack, run_places in runs:
        res, out, err = execute.run_captured(RunRequest(
            run_stack, True, tuple(guest_bench_command(run_places)), model_path=req.model_path,
            timeout_s=req.timeout_s,
        ))
        if res.exit_status != 0:
            raise VmFailed(
                f"llama-bench in the {run_stack.name} guest exited {res.exit_status}: {err.strip()[-800:]}",
                fix=f"see {res.run_dir}",
            )
        outputs.append(out)
        sections = report.split_sections(out)
        results += [r for where in run_places for r in report.parse_llama_bench(where, sections.get(where, ""))]
    assert res is not None
    host_text = host_native_bench(req.model_path) if req.host_baseline else None
    if host_text is not None:
        results += report.parse_llama_bench("host-native", host_text)
    gpu_where = "guest-apir" if apir else "guest-gpu"
    gate = report.gate(results, gpu_where=gpu_where)
    req.out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{stack.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    png = report.plot(results, f"{stack.name} / {req.label}", req.out_dir / f"{stem}.png")
    data = report.report(
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
    json_path = report.write_report(data, req.out_dir / f"{stem}.json")
    md = report.write_markdown(data, req.out_dir / f"{stem}.md")
    return report.BenchRun({**data, "json": str(json_path), "markdown": str(md)}, results, gate, outputs)
