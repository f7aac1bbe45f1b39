"""`provision ggml build`: cached ggml builds from the pinned llama.cpp tree."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from provision.cli.output import command, table
from provision.core import values
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "ggml": "build ggml (APIR host backend, guest frontend) from the pinned source",
}


def register(sub: argparse._SubParsersAction) -> None:
    from provision.apir import ggml as ggml_build

    p = command(sub, "ggml", COMMANDS["ggml"], "provision ggml build --variant host")
    actions = p.add_subparsers(dest="ggml_command", metavar="ACTION", required=True)
    b = command(
        actions,
        "build",
        "build one variant into the cache (reused when already built)",
        "provision ggml build --variant host -j 2",
        json=True,
    )
    b.add_argument("--variant", choices=sorted(ggml_build.VARIANTS), default="host",
                   help="host (backend + CPU), vulkan, cuda, cuda-tools (cuda + native llama-bench, "
                   "test-backend-ops), or guest (frontend + llama-bench)")
    b.add_argument("--jobs", "-j", type=int, default=2, help="parallel compile jobs (default 2)")
    b.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES for --variant cuda (e.g. 90)")
    b.add_argument("--source", type=Path, default=None,
                   help="a copy of the pinned llama.cpp tree to build instead of the sdist's (offline machines)")
    b.add_argument("--force", action="store_true", help="rebuild even when the cache has this build")
    b.add_argument("--dry-run", action="store_true", help="print the plan (commands, key) and build nothing")
    b.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> Result:
    from provision.apir import builds
    from provision.apir import ggml as ggml_build

    values.int_range(args.jobs, "--jobs", 1, 1024)
    values.token(args.cuda_arch, "--cuda-arch")
    values.existing_dir(args.source, "--source")
    cuda_arch = (args.cuda_arch or "native") if "GGML_CUDA" in ggml_build.variant(args.variant).defines else None
    if args.dry_run:
        plan, _ = builds.plan_for(args.variant, jobs=args.jobs, cuda_architectures=cuda_arch, source=args.source,
                                  fetch=False)
        return Result(plan.as_dict(), "\n".join([f"# ggml {plan.variant} build, cache key {plan.key}",
                                                 shlex.join(plan.configure), shlex.join(plan.build)]))
    built = builds.ensure(args.variant, jobs=args.jobs, cuda_architectures=cuda_arch, source=args.source,
                          force=args.force)
    data = {"variant": built.variant, "key": built.key, "bin_dir": str(built.bin_dir), "manifest": built.manifest}
    m: dict[str, Any] = dict(built.manifest)
    rows = [("variant", built.variant), ("bin", built.bin_dir), ("targets", " ".join(m["targets"])),
            ("apir protocol", ".".join(str(x) for x in m["apir_protocol"])),
            ("timings", m.get("timings")), ("built", m.get("built_at"))]
    return Result(data, table(["FIELD", "VALUE"], rows))
