#!/usr/bin/env python3
"""Served generation speed against llama-bench's tg on the same stack, device and model.

One run each: `provision serve STACK --model M --gpu --detach` answers one greedy
/v1/completions request of N tokens (EOS ignored); its tokens/s are llama-server's own
``timings.predicted_per_second`` and the request's wall clock. Then `provision run` boots the
same guest and runs ``llama-bench -p 0 -n N`` on the same device. The ratio served/bench says
what the HTTP server, its batching and the published port cost. Not a test: the numbers depend
on the machine, its load and the accelerator (TCG here).

    .venv/bin/python bench/serve.py [--stack llama-linux] [--model tiny-llama] [--tokens 64] [--cpu]
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import subprocess
import sys
import time
from typing import Any


def provision(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, errors="replace")


def served(stack: str, model: str, gpu: bool, tokens: int) -> dict[str, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = f"bench-serve-{port}"
    flags = ["--gpu"] if gpu else []
    proc = provision("serve", stack, "--model", model, *flags, "--detach", "--port", str(port), "--name", name)
    if proc.returncode != 0:
        sys.exit(f"serve failed: {proc.stderr[-2000:]}")
    try:
        body = {"model": model, "prompt": "t1 t2 t3", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
        start = time.monotonic()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        reply: dict[str, Any] = json.loads(conn.getresponse().read())
        wall = time.monotonic() - start
    finally:
        provision("stop", name)
    timings = reply.get("timings", {})
    generated = int(reply.get("usage", {}).get("completion_tokens", tokens))
    return {
        "server_tg_tps": float(timings.get("predicted_per_second", 0.0)),
        "wall_tps": generated / wall,
        "tokens": generated,
    }


def bench_tg(stack: str, model: str, gpu: bool, tokens: int) -> float:
    device = ["-dev", "Vulkan0", "-ngl", "99"] if gpu else ["-dev", "none", "-ngl", "0"]
    script = f'llama-bench -m "$MODEL" -p 0 -n {tokens} -r 1 -o json {" ".join(device)}'
    flags = ["--gpu"] if gpu else []
    proc = provision("run", stack, *flags, "--model", model, "--", "sh", "-c", script)
    if proc.returncode != 0:
        sys.exit(f"llama-bench failed: {proc.stderr[-2000:]}")
    rows = json.loads(proc.stdout[proc.stdout.index("[") :])
    return float(next(r["avg_ts"] for r in rows if r["n_gen"] > 0))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", default="llama-linux")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cpu", action="store_true", help="serve and bench on the guest CPU instead of the GPU")
    args = ap.parse_args()
    gpu = not args.cpu
    s = served(args.stack, args.model, gpu, args.tokens)
    tg = bench_tg(args.stack, args.model, gpu, args.tokens)
    result = {
        **s,
        "bench_tg_tps": tg,
        "ratio_server_vs_bench": s["server_tg_tps"] / tg,
        "ratio_wall_vs_bench": s["wall_tps"] / tg,
    }
    where = "GPU (Venus)" if gpu else "guest CPU"
    print(f"{args.stack} / {args.model} on the {where}, {args.tokens} tokens:")
    print(f"  llama-bench tg{args.tokens}:            {tg:9.2f} t/s")
    print(
        f"  served (llama-server timings): {s['server_tg_tps']:9.2f} t/s  ratio {result['ratio_server_vs_bench']:.2f}"
    )
    print(f"  served (request wall clock):   {s['wall_tps']:9.2f} t/s  ratio {result['ratio_wall_vs_bench']:.2f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
