"""Read facts (never code) from the pinned upstream trees into nix/facts/upstream.json.

Each tree is a local git clone or bare mirror, given as PATH or PATH@REV; nixpkgs is a folder laid
out like the nixpkgs tree holding only the package files we read, plus a COMMITS.json that maps each
file to the nixpkgs commit it was read from. Every fact carries tree, rev, file and line.

  .venv/bin/python checks/upstream-facts \\
      --libkrun CLONE[@REV] --krunkit CLONE[@REV] \\
      --virglrenderer-apir CLONE --virglrenderer-apir-darwin CLONE --virglrenderer-apir-macos CLONE \\
      --virglrenderer-venus CLONE@REV --virglrenderer-vtest CLONE --nixpkgs FOLDER [--check]

A tree is read at the rev (or tag) that provision/data/pins.json pins. When the clone lacks it,
@REV names what to read instead and the fact says so ("pin_in_clone": false). The patches a pin
lists are checked with `git apply --check` against that tree, and what they change is recorded.
--check compares with the committed files instead of writing them (exit 1 when they differ).
Output is sorted and byte-identical on re-run; it holds no path of this machine. It also writes
the argument sets alone to nix/tests/stub-nixpkgs/facts.json for the stub nixpkgs.

  .venv/bin/python checks/upstream-facts --upstream ../shared/upstream [--out FILE] [--check]

reads the trees instead from the `git archive` tarballs (or their unpacked folders) of
../shared/upstream, each refused (E042) unless its NAR hash is its pin's (tarballs.py names the
stand-ins). What an archive cannot show is kept as read before, from --read FILE (default: the
committed facts): the nixpkgs section and the patches' comparison with upstream's fix commits
(`_sections` in the file says which is which). The stub file is not written then.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from .krun import krunkit_facts, libkrun_facts
from .nixpkgs import nixpkgs_facts
from .tarballs import ProvisionError, open_archive
from .trees import REPO, FactsError, Tree, open_tree
from .virgl import patch_facts, virgl_facts

PINS = REPO / "provision" / "data" / "pins.json"
OUT = REPO / "nix" / "facts" / "upstream.json"
STUB_ARGS = REPO / "nix" / "tests" / "stub-nixpkgs" / "facts.json"

VIRGL_TREES = ("virglrenderer-apir", "virglrenderer-apir-darwin", "virglrenderer-apir-macos", "virglrenderer-venus")
# Trees read only for the patches their pin lists (no build of ours reads their other facts).
PATCHED_TREES = ("virglrenderer-vtest",)


# Where each top-level section comes from; the same text whichever way the file is made.
SECTIONS = {
    "virglrenderer": "COMPUTED: read from the trees; regenerated in CI from ../shared/upstream "
    "(checks/upstream-facts --upstream, tests/nix/test_upstream_facts_tarballs.py)",
    "libkrun": "COMPUTED: read from the tree; regenerated in CI from ../shared/upstream",
    "krunkit": "COMPUTED: read from the tree; regenerated in CI from ../shared/upstream",
    "patches": "COMPUTED in CI from ../shared/upstream (our patches applied to the pinned trees), except each "
    "tree's `fixes`: READ, from git clones holding upstream's fix commits (an archive has no history)",
    "nixpkgs": "READ: NixOS/nixpkgs package files at the commits named per package (docs/nix.md); not in "
    "../shared/upstream, kept as read when CI regenerates the rest",
}

Opener = Callable[[str], tuple[Tree, dict[str, Any]]]


def collect(opener: Opener, pins: dict[str, Any], read: dict[str, Any] | None, nixpkgs: Path | None) -> dict[str, Any]:
    """The facts, each tree opened by `opener`; with `read` (facts read before), what archives cannot
    show is taken from it."""
    sources = pins["sources"]
    facts: dict[str, Any] = {
        "_about": "Facts read from the pinned upstream trees by checks/upstream-facts; regenerate, never edit. "
        "Each fact names tree, rev, file and line (docs/nix.md).",
        "_sections": SECTIONS,
        "virglrenderer": {},
        "patches": {},
    }
    for name in VIRGL_TREES:
        tree, info = opener(name)
        facts["virglrenderer"][name] = virgl_facts(tree, info)
        fixes = [f["commit"] for f in sources[name].get("linux_fixes", []) if f.get("applied_by_patch")]
        kept = read_section(read, "patches", name, "fixes") if read is not None else None
        facts["patches"][name] = patch_facts(tree, sources[name].get("patches", []), fixes, kept)
    for name in PATCHED_TREES:
        tree, _ = opener(name)
        fixes = [f["commit"] for f in sources[name].get("linux_fixes", []) if f.get("applied_by_patch")]
        kept = read_section(read, "patches", name, "fixes") if read is not None and fixes else None
        facts["patches"][name] = patch_facts(tree, sources[name].get("patches", []), fixes, kept)
    tree, info = opener("libkrun")
    facts["libkrun"] = libkrun_facts(tree, info)
    tree, info = opener("krunkit")
    facts["krunkit"] = krunkit_facts(tree, info)
    if read is not None:
        facts["nixpkgs"] = read_section(read, "nixpkgs")
        if facts["nixpkgs"].get("locked_rev") != pins["nixpkgs"]["rev"]:
            raise FactsError(
                "the nixpkgs facts read before are for another locked rev\n"
                "fix: regenerate with --nixpkgs (docs/nix.md), pins.json nixpkgs.rev changed"
            )
    else:
        assert nixpkgs is not None
        facts["nixpkgs"] = nixpkgs_facts(nixpkgs, pins["nixpkgs"])
    return facts


def read_section(read: dict[str, Any], *keys: str) -> Any:
    value: Any = read
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise FactsError(
                f"the facts read before have no {'.'.join(keys)}\n"
                "fix: pass --read the committed nix/facts/upstream.json, or regenerate it with clones (docs/nix.md)"
            )
        value = value[key]
    return value


def stub_args(facts: dict[str, Any]) -> dict[str, Any]:
    return {
        "_about": "Argument sets of the nixpkgs package functions, generated by checks/upstream-facts from the "
        "same reads as nix/facts/upstream.json (the stub nixpkgs cannot read files outside its folder).",
        "packages": {
            n: {a: v["default"] for a, v in p["arguments"].items()} for n, p in facts["nixpkgs"]["packages"].items()
        },
    }


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_whole(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checks/upstream-facts", description=__doc__.split("\n\n")[0])
    for name in ("libkrun", "krunkit", *VIRGL_TREES, *PATCHED_TREES):
        parser.add_argument(f"--{name}", metavar="CLONE[@REV]")
    parser.add_argument("--nixpkgs", metavar="FOLDER")
    parser.add_argument("--upstream", type=Path, metavar="DIR", help="the pinned tarballs (../shared/upstream)")
    parser.add_argument("--read", type=Path, default=OUT, help="facts read before (with --upstream)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stub-out", type=Path, default=STUB_ARGS)
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = parser.parse_args(argv)
    trees = ("libkrun", "krunkit", *VIRGL_TREES, *PATCHED_TREES)
    given = [n for n in (*trees, "nixpkgs") if getattr(args, n.replace("-", "_"))]
    if args.upstream is None and len(given) < len(trees) + 1:
        parser.error("pass --upstream DIR, or every tree: --libkrun --krunkit --virglrenderer-* --nixpkgs")
    if args.upstream is not None and given:
        parser.error(f"--upstream reads every tree from DIR; drop --{given[0]}")
    pins = json.loads(PINS.read_text())
    try:
        with tempfile.TemporaryDirectory(prefix="upstream-facts-") as work:
            if args.upstream is not None:
                archives = partial(open_archive, upstream=args.upstream, pins=pins["sources"], work=Path(work))
                facts = collect(archives, pins, load_read(args.read), None)
            else:
                clones = partial(open_clone, args=args, pins=pins["sources"])
                facts = collect(clones, pins, None, Path(args.nixpkgs))
    except FactsError as err:
        print(f"upstream-facts: {err}", file=sys.stderr)
        return 2
    except ProvisionError as err:
        print(f"upstream-facts: {err.render()}", file=sys.stderr)
        return err.exit_status
    outputs = [(args.out, render(facts))]
    if args.upstream is None:
        outputs.append((args.stub_out, render(stub_args(facts))))
    if args.check:
        stale = [str(p) for p, text in outputs if not p.exists() or p.read_text() != text]
        for p in stale:
            print(f"upstream-facts: {p} differs from what the trees say", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs:
        write_whole(path, text)
    return 0


def open_clone(name: str, args: argparse.Namespace, pins: dict[str, Any]) -> tuple[Tree, dict[str, Any]]:
    return open_tree(name, getattr(args, name.replace("-", "_")), pins[name])


def load_read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise FactsError(f"--read {path.name}: {err}\nfix: pass the committed nix/facts/upstream.json") from err
    if not isinstance(data, dict):
        raise FactsError(f"--read {path.name}: not a facts file\nfix: pass the committed nix/facts/upstream.json")
    return data
