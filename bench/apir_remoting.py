#!/usr/bin/env python3
"""The APIR route against native: tokens/s natively, through the route before and after the cut, the ratios,
and the cost of a token by command (issues 27 and 40).

Two APIR loopbacks (guest frontend + host libggml-virtgpu-backend in one process, no VM,
checks/apir-loopback/virtgpu-loopback.cpp) are built from the pinned tree: "before" with the
series without its cuts (APIR 0.3: 0006 shared, 0007 guest, 0008-0009 host; APIR 0.4: 0011 shared, 0012
and 0014 guest, 0013 host; APIR 0.5: 0015 shared, 0016 guest, 0017 host; APIR 0.6: 0022 shared, 0023 guest,
0024 host), "after" with the whole series.
The same llama-bench runs natively and through each, alternately, with the loopback's per-command
profile on (APIR_LOOPBACK_STATS; with 0008 the host's time is split into decode, compute and copy).
Each test runs twice through the route, with 1 and with R repetitions: the difference divided by
(R-1) x tokens is the cost of one more token, without model load and warm-up. Correctness:
checks/apir-loopback/greedy.cpp decodes greedily natively and through the "after" route; the token ids
must be the same (the exit status says so; speed is never gated).

  python bench/apir_remoting.py                   # here: CPU target, `host` + `guest` ggml builds
  python bench/apir_remoting.py --target cuda --source TREE --drm-include DIR --cuda-arch 90
                                                  # a CUDA host without a chroot (the lent H200)
  ... --greedy-only                               # the tokens only, "after" then "before", no llama-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from provision.apir import builds  # noqa: E402
from provision.cli.output import table  # noqa: E402
from provision.core import layout, paths  # noqa: E402
from provision.hosts.linux.apir import loopback  # noqa: E402
from provision.hosts.linux.apir import loopback_no_chroot as loopback_host  # noqa: E402
from provision.images import sources  # noqa: E402

# The cut under test (APIR 0.3 to 0.6): the patches the series gained last; "before" lacks them all. 0010 (the
# guest sizes tensors as the host's buffer type asks) is a fix of both, not part of the cut.
CUT = ("0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch", "0007-ggml-virtgpu-one-round-trip-per-token.patch",
       "0008-ggml-virtgpu-backend-graph-run.patch", "0009-ggml-virtgpu-backend-zero-new-buffers.patch",
       "0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
       "0012-ggml-virtgpu-outputs-with-the-graph.patch",
       "0013-ggml-virtgpu-backend-outputs-with-the-graph.patch",
       "0014-ggml-virtgpu-run-when-the-outputs-are-wanted.patch",
       "0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch", "0016-ggml-virtgpu-send-use-counts.patch",
       "0017-ggml-virtgpu-backend-use-counts.patch",
       "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
       "0023-ggml-virtgpu-send-inputs-by-reference.patch", "0024-ggml-virtgpu-backend-writes-by-reference.patch")
# The libraries of llama-bench that a `guest` build keeps beside it (the CPU target's lib dir has none).
LLAMA_LIBS = ("libllama-bench-impl.so", "libllama-common.so.0", "libllama.so.0")


@dataclass(frozen=True)
class Variant:
    name: str
    guest_patches: tuple[str, ...]
    host_patches: tuple[str, ...]


def variants() -> tuple[Variant, Variant]:
    guest, host = tuple(loopback.guest_patches()), tuple(loopback.HOST_PATCHES)
    assert set(CUT) <= set(guest) | set(host), "the cut is part of the series"
    # A host patch after the cut's first (0018, the host's refusals, ...) is written on top of it: its hunks need
    # the cut's code, so "before" lacks it too.
    first = min(host.index(p) for p in CUT if p in host)
    return (Variant("before", tuple(p for p in guest if p not in CUT), host[:first]),
            Variant("after", guest, host))


def per_token(one: Mapping[str, Any], many: Mapping[str, Any], extra_tokens: int) -> dict[str, dict[str, float]]:
    """The profile of `extra_tokens` more tokens (the run with more repetitions minus the other), per token."""
    out: dict[str, dict[str, float]] = {}
    for cmd, m in many.items():
        o = one.get(cmd, {})
        keys = ("n", *(k for k in TIMES if k in m))
        row = {k: (float(m[k]) - float(o.get(k, 0))) / extra_tokens for k in keys}
        if row["n"] > 0.005:
            out[cmd] = {"n": round(row["n"], 2), **{k.replace("_ns", "_us"): round(row[k] / 1000, 2)
                                                     for k in keys if k != "n"}}
    return out


# The loopback's times per command; the last three only from hosts with patch 0008 (the host's split).
TIMES = ("encode_ns", "host_ns", "reply_ns", "decode_ns", "compute_ns", "copy_ns")


def totals(profile: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    keys = ("n", *(k.replace("_ns", "_us") for k in TIMES))
    return {k: round(sum(r.get(k, 0.0) for r in profile.values()), 2) for k in keys}


def ratio_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for test, r in results.items():
        b, a, n = r["before"], r["after"], r["native"]
        # Medians of llama-bench's own samples too: one slow repetition (a clock ramping up, the first
        # prompt of a process) moves a mean of short pp runs by more than the route costs.
        med = {k: r[k].get("median") for k in ("native", "before", "after")}
        rows.append({"test": test, "native_ts": n["ts"], "native_sd": n["sd"],
                     "native_median": med["native"], "after_median": med["after"],
                     "after_over_native_median": round(med["after"] / med["native"], 3)
                     if med["after"] and med["native"] else None,
                     "before_ts": b["ts"], "before_sd": b["sd"], "after_ts": a["ts"], "after_sd": a["sd"],
                     "before_over_native": round(b["ts"] / n["ts"], 3) if n["ts"] else None,
                     "after_over_native": round(a["ts"] / n["ts"], 3) if n["ts"] else None,
                     "ratio": round(a["ts"] / b["ts"], 3) if b["ts"] else None,
                     "before_round_trips": b["total"]["n"], "after_round_trips": a["total"]["n"],
                     "before_remoting_us": round(b["total"]["encode_us"] + b["total"]["reply_us"], 1),
                     "after_remoting_us": round(a["total"]["encode_us"] + a["total"]["reply_us"], 1),
                     "before_host_us": b["total"]["host_us"], "after_host_us": a["total"]["host_us"]})
    return rows


def render(report: Mapping[str, Any]) -> str:
    lines = [f"APIR loopback, {report['device']} against native {report['native_device']}, model "
             f"{Path(report['model']).name}; per token = ({report['repetitions']} - 1 repetitions) difference"]
    cols = ["test", "native_ts", "before_ts", "after_ts", "before_over_native", "after_over_native",
            "after_over_native_median",
            "before_round_trips", "after_round_trips", "before_remoting_us", "after_remoting_us",
            "before_host_us", "after_host_us"]
    lines.append(table([c.upper() for c in cols], [[r[c] for c in cols] for r in report["side_by_side"]]))
    for test, r in report["results"].items():
        for name in ("before", "after"):
            unit = "run" if "per_run" in r[name] else "token"
            prof = r[name][f"per_{unit}"]
            split = any("compute_us" in p for p in prof.values())
            head = ["COMMAND", "N", "ENCODE_US", "HOST_US", "REPLY_US"] + (
                ["DECODE_US", "COMPUTE_US", "COPY_US"] if split else [])
            lines.append(f"\n{test} {name}: per {unit}, by command")
            lines.append(table(head, [[c, p["n"], p["encode_us"], p["host_us"], p["reply_us"]]
                                      + ([p.get("decode_us"), p.get("compute_us"), p.get("copy_us")] if split else [])
                                      for c, p in prof.items()]))
    g = report["greedy"]
    lines.append(f"\ngreedy {g['n_tokens']} tokens: native and {report['device']} (after) "
                 f"{'the same' if g['same'] else 'DIFFER'}: {' '.join(map(str, g['native'][:16]))} ...; "
                 f"ggml-cuda's CUDA graph log lines: {g['cuda_graph_log']}")
    if report.get("cuda_graphs_off"):
        lines.append(f"tg with GGML_CUDA_DISABLE_GRAPHS=1: {report['cuda_graphs_off']}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Setup:
    target: str
    device: str
    native_device: str
    lib: Path  # the host ggml (libggml-base, the target's backend)
    llama_bin: Path  # where llama-bench and its libraries come from
    work: Path
    tree: Path
    drm_include: Path


def cpu_setup(work: Path) -> Setup:
    host = builds.ensure("host")
    guest = builds.ensure("guest")
    # The loopback patches its own copy: the pinned tree as it is, not the host build's patched one.
    return Setup("cpu", loopback.TARGETS["cpu"][2], "none", host.bin_dir, guest.bin_dir, work,
                 sources.llama_cpp_tree(), builds.drm_headers())


def cuda_setup(work: Path, source: Path, drm_include: Path, cuda_arch: str, jobs: int) -> Setup:
    built = builds.ensure("cuda-tools", jobs=jobs, cuda_architectures=cuda_arch, source=source.resolve())
    return Setup("cuda", loopback.TARGETS["cuda"][2], "CUDA0", built.bin_dir, built.bin_dir, work, source.resolve(),
                 drm_include.resolve())


def build(setup: Setup, v: Variant) -> loopback_host.HostDirs:
    dirs = loopback_host.HostDirs(tree=setup.tree, loopback_src=loopback.loopback_dir(),
                                  patches=layout.patches_dir() / "llama.cpp", work=setup.work / v.name,
                                  drm_include=setup.drm_include, lib=setup.lib)
    dirs.work.mkdir(parents=True, exist_ok=True)
    script = loopback_host.build_script(dirs, v.guest_patches, setup.target, v.host_patches)
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"loopback build {v.name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    # llama-bench beside the loopback registry (its backend scan finds libggml-virtgpu.so there).
    # Sonames that the build's libraries ask for reach the loopback's copies: one libggml (the
    # loopback registry) and one libggml-virtgpu-backend (two copies double-free at exit).
    shutil.copy2(setup.llama_bin / "llama-bench", dirs.bin / "llama-bench")
    if setup.llama_bin != setup.lib:
        for name in LLAMA_LIBS:
            shutil.copy2(setup.llama_bin / name, dirs.bin / name)
    for soname, target in (("libggml.so.0", "libggml.so"),
                           ("libggml-virtgpu-backend.so.0", "libggml-virtgpu-backend.so")):
        (dirs.bin / soname).unlink(missing_ok=True)
        (dirs.bin / soname).symlink_to(target)
    return dirs


def route_env(setup: Setup, dirs: loopback_host.HostDirs) -> dict[str, str]:
    # CUDA: the caller's environment (the driver and runtime paths), as checks/apir-cuda runs it.
    base = dict(os.environ) if setup.target == "cuda" else {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    env = {**base, **loopback_host.bench_env(dirs, setup.target)}
    if setup.target == "cpu":
        env["APIR_LOOPBACK_DEVICE_TYPE"] = "gpu"  # llama's tools offload to GPU-type devices only
        # and its memory is the device's own, as a GPU's: inputs and outputs cross as on CUDA
        env["APIR_LOOPBACK_NO_HOST_PTR"] = "1"
    return env


def native_env(setup: Setup, dirs: loopback_host.HostDirs) -> dict[str, str]:
    """CUDA: the build's own binaries and libraries (RUNPATH). CPU: the loopback's directory, its
    remote device left a CPU (which llama's tools do not offload to), so the CPU backend computes."""
    if setup.target == "cuda":
        return dict(os.environ)
    env = route_env(setup, dirs)
    env.pop("APIR_LOOPBACK_DEVICE_TYPE")
    env.pop("APIR_LOOPBACK_NO_HOST_PTR")
    return env


def llama_bench(setup: Setup, dirs: loopback_host.HostDirs, model: Path, test: Sequence[str], reps: int,
                stats: Path | None) -> dict[str, Any]:
    """Through the route (stats: the loopback's profile goes there), or natively (stats None)."""
    if stats is None:
        binary = (setup.llama_bin if setup.target == "cuda" else dirs.bin) / "llama-bench"
        ngl = "99" if setup.target == "cuda" else "0"
        env, dev = native_env(setup, dirs), ["-dev", setup.native_device, "-ngl", ngl]
    else:
        binary, env = dirs.bin / "llama-bench", {**route_env(setup, dirs), "APIR_LOOPBACK_STATS": str(stats)}
        dev = ["-dev", setup.device, "-ngl", "99"]
    argv = [str(binary), "-m", str(model), *dev, *test, "-r", str(reps), "-o", "jsonl"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not records or (stats is not None and not stats.exists()):
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    report = json.loads(stats.read_text()) if stats is not None else {}
    # "running": the commands after the first graph computed, without the model's load (a loopback's own)
    return {"record": records[-1], "commands": report.get("commands", {}), "running": report.get("running", {})}


def build_greedy(setup: Setup, dirs: loopback_host.HostDirs) -> Path:
    """checks/apir-loopback/greedy.cpp against the build's libllama; it runs from the loopback's
    directory through the route and (CPU target) natively, from its own for native CUDA."""
    out = setup.work / "greedy" / "greedy"
    out.parent.mkdir(parents=True, exist_ok=True)
    inc = [f"-I{setup.tree / 'include'}", f"-I{setup.tree / 'ggml' / 'include'}"]
    argv = ["g++", "-std=c++17", "-O1", *inc, str(loopback.loopback_dir() / "greedy.cpp"), "-o", str(out),
            f"-L{setup.llama_bin}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{setup.llama_bin}"]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"greedy build failed:\n{proc.stderr[-3000:]}")
    shutil.copy2(out, dirs.bin / "greedy")
    return out


def greedy(setup: Setup, dirs: loopback_host.HostDirs, model: Path, n_tokens: int,
           route_extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Greedy token ids natively and through the route (route_extra: more of the loopback's
    environment, e.g. APIR_LOOPBACK_ALLOC_PAD); the route must not change one."""
    native_bin = setup.work / "greedy" / "greedy" if setup.target == "cuda" else dirs.bin / "greedy"
    runs = {"native": ([str(native_bin), str(model), setup.native_device, str(n_tokens)], native_env(setup, dirs)),
            "route": ([str(dirs.bin / "greedy"), str(model), setup.device, str(n_tokens)],
                      {**route_env(setup, dirs), **(route_extra or {})})}
    tokens: dict[str, list[int]] = {}
    graphs: dict[str, dict[str, int]] = {}
    for name, (argv, env) in runs.items():
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        tokens[name] = [int(t) for t in lines[-1].split()]
        # ggml-cuda's own debug lines (greedy sets no logger): the evidence that CUDA graphs ran
        graphs[name] = {"warmup_complete": proc.stderr.count("CUDA graph warmup complete"),
                        "graph_reused": proc.stderr.count("CUDA Graph id")}
        if len(tokens[name]) != n_tokens:
            raise SystemExit(f"{' '.join(argv)}: {len(tokens[name])} tokens, not {n_tokens}")
    return {"n_tokens": n_tokens, "native": tokens["native"], "route": tokens["route"],
            "same": tokens["native"] == tokens["route"], "cuda_graph_log": graphs}


def cuda_graphs_off(setup: Setup, dirs: loopback_host.HostDirs, model: Path, test: Sequence[str], reps: int,
                    stats: Path) -> dict[str, float]:
    """tg natively and through the route with ggml-cuda's CUDA graphs off: where the route's
    speed drops as much as native's, the route runs CUDA graphs too."""
    os.environ["GGML_CUDA_DISABLE_GRAPHS"] = "1"
    try:
        native = llama_bench(setup, dirs, model, test, reps, None)["record"]
        route = llama_bench(setup, dirs, model, test, reps, stats)["record"]
    finally:
        del os.environ["GGML_CUDA_DISABLE_GRAPHS"]
    return {"native_ts": round(float(native["avg_ts"]), 1), "after_ts": round(float(route["avg_ts"]), 1)}


def median_ts(record: Mapping[str, Any]) -> float | None:
    """The median of llama-bench's samples (its JSON record's samples_ts), None where it gave none."""
    samples = [float(v) for v in record.get("samples_ts") or ()]
    return round(statistics.median(samples), 1) if samples else None


def measure(setup: Setup, built: Mapping[str, loopback_host.HostDirs], model: Path, tests: Mapping[str, Sequence[str]],
            reps: int, results: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fills `results` as it goes (a caller keeps what was measured when a later run fails)."""
    results = {} if results is None else results
    with tempfile.TemporaryDirectory() as tmp:
        for test, argv in tests.items():
            prompt = argv[argv.index("-n") + 1] == "0"  # its commands are per run, not per token
            tokens = int(argv[argv.index("-p") + 1]) if prompt else int(argv[argv.index("-n") + 1])
            results[test] = {}
            native = llama_bench(setup, built["after"], model, argv, reps, None)["record"]
            results[test]["native"] = {"ts": round(float(native["avg_ts"]), 1),
                                       "sd": round(float(native["stddev_ts"]), 1), "median": median_ts(native)}
            print(f"{test} native: {results[test]['native']['ts']} t/s", file=sys.stderr, flush=True)
            for name, dirs in built.items():  # alternately, so both see the same machine load
                one = llama_bench(setup, dirs, model, argv, 1, Path(tmp) / f"{name}-{test}-1.json")
                many = llama_bench(setup, dirs, model, argv, reps, Path(tmp) / f"{name}-{test}-r.json")
                # A prompt's commands are per run, a few against the load's hundreds of weight uploads, which
                # vary by more: its profile counts only the commands after the first graph computed.
                part = "running" if prompt and one["running"] and many["running"] else "commands"
                prof = per_token(one[part], many[part], (reps - 1) * tokens)
                rec = many["record"]
                results[test][name] = {"ts": round(float(rec["avg_ts"]), 1), "sd": round(float(rec["stddev_ts"]), 1),
                                       "median": median_ts(rec),
                                       "per_token": prof, "total": totals(prof),
                                       "setup_commands": {c: int(v["n"]) for c, v in one["commands"].items()}}
                if prompt:  # its commands per run (per token they round to 0)
                    results[test][name]["per_run"] = per_token(one[part], many[part], reps - 1)
                results[test][name]["profile_from"] = part
                print(f"{test} {name}: {results[test][name]['ts']} t/s, {results[test][name]['total']}",
                      file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--model", type=Path, help="GGUF (default: the store's llama-kquant)")
    p.add_argument("--source", type=Path, help="cuda: a copy of the pinned llama.cpp tree")
    p.add_argument("--drm-include", type=Path, help="cuda: dir with xf86drm.h, libdrm/ and drm/")
    p.add_argument("--cuda-arch", default="90")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--work", type=Path, help="build dir (default: the cache's apir-remoting/<target>)")
    p.add_argument("-n", "--n-gen", type=int, default=32)
    p.add_argument("-p", "--n-prompt", type=int, default=128)
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--greedy-tokens", type=int, default=32, help="tokens of the greedy correctness run")
    p.add_argument("--json", type=Path, help="write the report here too")
    p.add_argument("--greedy-only", action="store_true",
                   help="only the greedy runs (after, then before), the report written after each")
    args = p.parse_args(argv)
    if args.repetitions < 2:
        p.error("--repetitions must be at least 2 (the per-token cost is a difference)")
    work = (args.work or paths.cache_dir("apir-remoting") / args.target).resolve()
    if args.model is None:
        from provision.models import store
        args.model = store.Store().path("llama-kquant")
    if args.target == "cuda":
        if not args.source or not args.drm_include:
            p.error("--target cuda needs --source and --drm-include")
        setup = cuda_setup(work, args.source, args.drm_include, args.cuda_arch, args.jobs)
    else:
        setup = cpu_setup(work)
    # The two loopbacks are independent, each a chain of single-threaded compiles: side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        built = dict(zip((v.name for v in variants()), pool.map(lambda v: build(setup, v), variants()), strict=True))
    if args.greedy_only:
        return greedy_only(setup, built, args)
    tests = {f"pp{args.n_prompt}": ["-p", str(args.n_prompt), "-n", "0"],
             f"tg{args.n_gen}": ["-p", "0", "-n", str(args.n_gen)]}
    results: dict[str, Any] = {}
    try:
        measure(setup, built, args.model.resolve(), tests, args.repetitions, results)
    except SystemExit as exc:  # what was measured still lands in the report, with the failure
        if args.json:
            _write(args.json, {"device": setup.device, "failed": str(exc)[-4000:], "partial_results": results})
        raise
    build_greedy(setup, built["after"])
    same = greedy(setup, built["after"], args.model.resolve(), args.greedy_tokens)
    # The same through the series before the cut: tells a fault of the cut from one it inherited.
    shutil.copy2(built["after"].bin / "greedy", built["before"].bin / "greedy")
    try:
        same_before: dict[str, Any] = greedy(setup, built["before"], args.model.resolve(), args.greedy_tokens)
    except SystemExit as exc:
        same_before = {"failed": str(exc)[-2000:]}
    graphs_off = None
    if setup.target == "cuda":
        tg = tests[f"tg{args.n_gen}"]
        graphs_off = cuda_graphs_off(setup, built["after"], args.model.resolve(), tg, args.repetitions,
                                     setup.work / "graphs-off-stats.json")
        print(f"tg{args.n_gen} with GGML_CUDA_DISABLE_GRAPHS=1: {graphs_off}", file=sys.stderr, flush=True)
    report = {"device": setup.device, "native_device": setup.native_device, "model": str(args.model),
              "repetitions": args.repetitions,
              "patches": {v.name: {"guest": v.guest_patches, "host": v.host_patches} for v in variants()},
              "side_by_side": ratio_rows(results), "greedy": same, "greedy_before": same_before,
              "cuda_graphs_off": graphs_off,
              "results": results}
    print(render(report))
    if args.json:
        _write(args.json, report)
    return 0 if same["same"] else 1


def greedy_only(setup: Setup, built: Mapping[str, loopback_host.HostDirs], args: argparse.Namespace) -> int:
    """The correctness runs alone, for a device call too short for llama-bench: "after" first, the
    report rewritten after each series so that a run cut short keeps what it decoded."""
    model = args.model.resolve()
    report: dict[str, Any] = {"device": setup.device, "native_device": setup.native_device, "model": str(model),
                              "patches": {v.name: {"guest": v.guest_patches, "host": v.host_patches}
                                          for v in variants()}}
    build_greedy(setup, built["after"])
    shutil.copy2(built["after"].bin / "greedy", built["before"].bin / "greedy")
    for name in ("after", "before"):
        try:
            report[f"greedy_{name}"] = greedy(setup, built[name], model, args.greedy_tokens)
        except SystemExit as exc:
            report[f"greedy_{name}"] = {"failed": str(exc)[-2000:]}
        g = report[f"greedy_{name}"]
        verdict = "FAILED" if "failed" in g else "the same" if g["same"] else f"DIFFER from token {first_diff(g)}"
        print(f"greedy {args.greedy_tokens} tokens, {name}: native and {setup.device} {verdict}",
              file=sys.stderr, flush=True)
        if args.json:
            _write(args.json, report)
    print(json.dumps({k: report[k] for k in ("greedy_after", "greedy_before")}))
    return 0 if report["greedy_after"].get("same") else 1


def first_diff(g: Mapping[str, Any]) -> int | None:
    """The index of the first token where the route leaves native (None: the same)."""
    return next((i for i, (a, b) in enumerate(zip(g["native"], g["route"], strict=True)) if a != b), None)


def _write(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
