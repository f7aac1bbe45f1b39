#!/usr/bin/env python3
"""Round-trip time of each APIR dispatcher command on the host, no VM: the floor of APIR's cost.

Drives libggml-virtgpu-backend exactly like virglrenderer's APIR worker (one fresh process,
initialize, then apir_backend_dispatcher per command) and times every command N times.
The guest adds the virtio-gpu round trip (kick, host wake-up, reply poll) on top of these.

  python bench/apir_dispatch.py --variant host            # CPU backend from the cached build
  python bench/apir_dispatch.py --variant cuda --cuda-arch 90
  python bench/apir_dispatch.py --backend B --ggml-library L --reg SYM --json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from provision.adapters import apir as adapter
from provision.apir import builds
from provision.apir import preflight as apir
from provision.cli.output import table


def run(settings: apir.ApirSettings, *, repeat: int, alloc_bytes: int, env: dict[str, str] | None = None
        ) -> dict[str, Any]:
    """One probe process: device info plus `repeat` timed calls of every command."""
    req = adapter.ProbeRequest(backend=settings.backend or "", ggml_library=settings.ggml_library,
                               ggml_reg=settings.ggml_reg, query_device=True, bench_repeat=repeat,
                               alloc_bytes=alloc_bytes, env=dict(env or {}))
    result = adapter.probe(req)
    error = apir.failure(result, settings)
    if error is not None:
        raise error
    rows = result.bench or []
    floor = min((r["median_us"] for r in rows), default=0.0) or 1.0
    for r in rows:
        r["x_fastest"] = round(r["median_us"] / floor, 1)
    dev = result.device or {}
    return {"device": {k: dev.get(k) for k in ("name", "description", "type", "memory_free", "memory_total")},
            "repeat": repeat, "alloc_bytes": alloc_bytes, "rows": rows,
            "initialize_ms": result.timings_ms.get("initialize"),
            "first_memory_query_ms": result.timings_ms.get("cmd.device_get_memory")}


def render(report: dict[str, Any]) -> str:
    dev = report["device"]
    head = (f"APIR dispatcher round trips on {dev['name']} ({dev['description']}), "
            f"{report['repeat']} calls each, buffers of {report['alloc_bytes'] >> 20} MiB; "
            f"initialize {report['initialize_ms']} ms, first GET_MEMORY {report['first_memory_query_ms']} ms")
    rows = [(r["cmd"], r["command"], r["n"], r["min_us"], r["median_us"], r["p95_us"], r["x_fastest"])
            for r in report["rows"]]
    return head + "\n" + table(["CMD", "COMMAND", "N", "MIN_US", "MEDIAN_US", "P95_US", "X_FASTEST"], rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--variant", choices=["host", "cuda", "vulkan"], default=None,
                   help="use the cached provision build of this variant (host = CPU backend)")
    p.add_argument("--cuda-arch", default="native")
    p.add_argument("--backend")
    p.add_argument("--ggml-library")
    p.add_argument("--reg")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--alloc-mib", type=int, default=64)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.variant:
        built = builds.ensure(args.variant, cuda_architectures=args.cuda_arch if args.variant == "cuda" else None)
        settings = apir.ApirSettings.resolve(backend=str(built.library("libggml-virtgpu-backend.so")),
                                             ggml_library=str(built.library(str(built.manifest["ggml_library"]))),
                                             ggml_reg=str(built.manifest["ggml_reg"]), env={})
    else:
        settings = apir.ApirSettings.resolve(backend=args.backend, ggml_library=args.ggml_library, ggml_reg=args.reg)
    report = run(settings, repeat=args.repeat, alloc_bytes=args.alloc_mib << 20)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
