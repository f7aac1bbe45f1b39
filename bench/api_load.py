#!/usr/bin/env python3
"""Jobs per minute through `provision api`, and the API's overhead against `provision run`.

Starts a real `provision api --listen 127.0.0.1:0 --max-vms C`, sends N identical jobs with C in
flight at once and times them; then runs the same N jobs as `provision run` processes, C at a
time. Prints both rates and the ratio (API wall / CLI wall; 1.00 = no overhead). One run, not a
test: the numbers depend on the machine, its load and the accelerator (TCG here).

    .venv/bin/python bench/api_load.py [--stack cpu] [--jobs 6] [--concurrency 2] [--code 'true'] [--gpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provision.cli.output import table  # noqa: E402
from tests.api.client import api_server  # noqa: E402


def through_api(stack: str, gpu: bool, code: str, jobs: int, concurrency: int, timeout: float) -> dict[str, Any]:
    body = {"language": stack, "gpu": gpu, "timeout": timeout, "code": code}
    with api_server("--max-vms", str(concurrency)) as api:
        start = time.monotonic()
        with ThreadPoolExecutor(jobs) as pool:
            answers = list(pool.map(lambda _: api.execute(body), range(jobs)))
        wall = time.monotonic() - start
    failed = [a for a in answers if a[0] != 200 or a[2]["exit_code"] != 0]
    if failed:
        raise SystemExit(f"api: {len(failed)} of {jobs} jobs failed: {failed[0]}")
    vm = sum(a[2]["duration_s"] for a in answers) / jobs
    return {"wall_s": round(wall, 1), "jobs_per_min": round(jobs * 60 / wall, 2), "mean_vm_s": round(vm, 1)}


def through_cli(stack: str, gpu: bool, code: str, jobs: int, concurrency: int, timeout: float) -> dict[str, Any]:
    argv = [sys.executable, "-m", "provision", "run", stack, *(["--gpu"] if gpu else [])]
    argv += ["--timeout", str(timeout), "--", "sh", "-c", code]

    def one(_: int) -> int:
        return subprocess.run(argv, capture_output=True, timeout=timeout + 600).returncode

    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        codes = list(pool.map(one, range(jobs)))
    wall = time.monotonic() - start
    if any(codes):
        raise SystemExit(f"provision run: exit statuses {codes}")
    return {"wall_s": round(wall, 1), "jobs_per_min": round(jobs * 60 / wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--stack", default="cpu")
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--code", default="true")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--concurrency", type=int, default=2, help="--max-vms for the API, processes at once for the CLI")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    shape = (args.stack, args.gpu, args.code, args.jobs, args.concurrency, args.timeout)
    api = through_api(*shape)
    cli = through_cli(*shape)
    report = {
        "stack": args.stack,
        "gpu": args.gpu,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "api": api,
        "cli": cli,
        "overhead_ratio": round(api["wall_s"] / cli["wall_s"], 3),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        table(
            ["WAY", "JOBS", "AT ONCE", "WALL S", "JOBS/MIN"],
            [
                ("provision api", args.jobs, args.concurrency, api["wall_s"], api["jobs_per_min"]),
                ("provision run", args.jobs, args.concurrency, cli["wall_s"], cli["jobs_per_min"]),
            ],
        )
    )
    print(f"API overhead: API wall / CLI wall = {report['overhead_ratio']:.3f} (1.000 = none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
