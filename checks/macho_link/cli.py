"""checks/macho-link TREE... : cross-build each darwin tree for aarch64-macos as Nix builds it; report
every default target, and check the library against libkrun's macOS calls."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import check, ggml, toolchain, trees

GGML = "ggml-virtgpu-backend"
KNOWN = [*sorted(trees.DARWIN_TREES), GGML]
# The tree the bundle builds; the others are kept to show what they do (tests/macho).
DEFAULT_TREES = ("virglrenderer-apir-macos",)


def _provision_errors() -> type[Exception]:
    sys.path.insert(0, str(trees.REPO))
    from provision.core.errors import ProvisionError

    return ProvisionError


ProvisionError = _provision_errors()


def cache_default() -> Path:
    sys.path.insert(0, str(trees.REPO))
    from provision.core.paths import cache_dir

    return cache_dir("macho-link")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checks/macho-link", description=__doc__)
    parser.add_argument(
        "trees",
        nargs="*",
        default=[*sorted(k for k in trees.DARWIN_TREES if k in DEFAULT_TREES), GGML],
        help=f"pins to check (known: {', '.join(KNOWN)})",
    )
    parser.add_argument("--upstream", type=Path, default=trees.UPSTREAM, help="folder of the pinned tarballs")
    parser.add_argument("--cache", type=Path, default=None, help="where builds and results are kept")
    parser.add_argument("--fresh", action="store_true", help="build again even when a result is cached")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    unknown = [t for t in args.trees if t not in KNOWN]
    if unknown:
        print(f"macho-link: unknown tree {unknown}\nfix: one of {KNOWN}", file=sys.stderr)
        return 2
    cache = args.cache or cache_default()
    results = []
    try:
        for name in args.trees:
            print(f"macho-link: {name}: cross-building for {toolchain.TARGET} (a few minutes)", file=sys.stderr)
            if name == GGML:
                results.append(ggml.cached_check(args.upstream, cache, args.fresh))
            else:
                results.append(check.cached_check(name, args.upstream, cache, args.fresh))
    except (trees.TreeError, toolchain.ToolchainError, ProvisionError) as exc:
        print(f"macho-link: {exc}", file=sys.stderr)
        return 2
    for r in results:
        failed = r.get("failed_targets", [])
        verdict = "FAIL" if r["problems"] or failed else "ok"
        lines = list(r["problems"])
        for target, t in sorted(r.get("targets", {}).items()):
            lines.append(f"{target}: {'built' if t['built'] else 'FAILED'}")
            lines += [f"  {e}" for e in t["errors"][:4] + t.get("file_problems", [])[:1] if not t["built"]]
        print(
            f"macho-link: {r['tree']} @{r.get('rev', 'sdist')[:8]}: {verdict}" + "".join(f"\n  {p}" for p in lines),
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(results, indent=1, sort_keys=True))
    return 1 if any(r["problems"] or r.get("failed_targets") for r in results) else 0
