#!/usr/bin/env python3
"""How long does `provision` take to start, next to a bare interpreter? (goal: ratio <= 5)

Times, interleaved so load changes hit every command alike, --runs times each:
  bare      python -c pass
  help      python -m provision --help
  stacks    python -m provision stacks
all from the same interpreter (this one), and prints the median of each and the ratios
help/bare and stacks/bare. Not a test: numbers depend on the machine and its load.

    .venv/bin/python bench/cli_startup.py [--runs 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "bare": [sys.executable, "-c", "pass"],
    "help": [sys.executable, "-m", "provision", "--help"],
    "stacks": [sys.executable, "-m", "provision", "stacks"],
}


# As a user's install runs: with its bytecode cache (a PYTHONDONTWRITEBYTECODE left in the caller's
# environment would time the compiler on every start instead).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def once(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=ENV)
    return time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    for argv in COMMANDS.values():  # warm the page cache and the bytecode cache first
        once(argv)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            samples[name].append(once(argv))
    median = {name: statistics.median(v) for name, v in samples.items()}
    result = {
        "runs": args.runs,
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "ratio_help": round(median["help"] / median["bare"], 2),
        "ratio_stacks": round(median["stacks"] / median["bare"], 2),
        "goal": 5,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, value in median.items():
            print(f"{name:7s} {value * 1000:7.1f} ms (median of {args.runs})")
        print(f"ratio help/bare   {result['ratio_help']:.2f}  (goal <= 5)")
        print(f"ratio stacks/bare {result['ratio_stacks']:.2f}  (goal <= 5)")
    return 0 if max(result["ratio_help"], result["ratio_stacks"]) <= 5 else 1


if __name__ == "__main__":
    sys.exit(main())
