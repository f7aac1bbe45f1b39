#!/usr/bin/env python3
"""How close does Venus in a QEMU guest get to the host's own Vulkan? (goal: pp ratio >= 0.5)

Runs `provision bench STACK --json` (one GPU guest: llama-bench on Vulkan0 = Venus and on
the guest CPU, then the same llama-bench on the host's own Vulkan device in the host-tools
tree) and prints the ratios: guest GPU / guest CPU (the gate, >= 2) and guest Venus / host
native (the remoting cost), plus the guest's wall time. Not a test: numbers depend on the
machine, its load and the accelerator (TCG here).

    .venv/bin/python bench/linux_venus.py [--stack llama-linux] [--model tiny-llama]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", default="llama-linux")
    ap.add_argument("--model", default="tiny-llama")
    args = ap.parse_args()
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "bench", args.stack, "--model", args.model, "--json"],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - start
    try:
        shown = json.loads(proc.stdout)  # the envelope: {"command", "status", "data", "error"}
    except json.JSONDecodeError:
        print(proc.stderr[-2000:], file=sys.stderr)
        return proc.returncode or 1
    if shown["error"]:
        print(json.dumps(shown["error"], indent=2), file=sys.stderr)
    report = shown["data"]
    if report is None:
        return proc.returncode
    for r in report["results"]:
        print(f"{r['where']:<12} {r['test']:<6} {r['tokens_per_s']:>9.1f} t/s")
    gate = report["gate"]
    print(f"gate  guest GPU / guest CPU (pp): {gate['factor']:.2f}  (need >= {gate['required']:g})")
    for test, ratio in sorted(report["remoting_ratio"].items()):
        print(f"remoting  guest Venus / host native ({test}): {ratio:.2f}")
    print(f"accel {report['accel']}  guest wall {report['guest_wall_s']} s  command wall {wall:.1f} s")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
