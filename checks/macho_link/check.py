"""Build one darwin tree for aarch64-macos as Nix builds it (the recipe's meson flags and postPatch;
nixpkgs' meson options: buildtype plain, which with the trees' b_ndebug=if-release still defines
NDEBUG, and auto_features enabled; every default target) and judge it: each default target built as
a real arm64 Mach-O (ninja -k 0, so one failure hides no other), and the library linked with
undefined symbols an error (b_lundef), exporting every virgl function libkrun calls on macOS, with a
header whose blob handle types are the ones libkrun's macOS code maps."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from . import macho, targets, toolchain, trees

UNDEFINED = re.compile(r"error: undefined symbol: (\S+)")
RUST_CONST = re.compile(r"pub const (VIRGL_RENDERER_BLOB_FD_TYPE_\w+): u32 = (\d+);")
C_DEFINE = re.compile(r"#define\s+(VIRGL_RENDERER_BLOB_FD_TYPE_\w+)\s+(0x[0-9a-fA-F]+|\d+)")
BINDINGS = "src/rutabaga_gfx/src/generated/virgl_renderer_bindings.rs"


def libkrun_macos_calls() -> list[str]:
    facts = json.loads(trees.FACTS.read_text())
    calls: list[str] = facts["libkrun"]["virgl_calls_per_os"]["macos"]
    return calls


def libkrun_handle_types(upstream: Path, work: Path) -> dict[str, int]:
    """VIRGL_RENDERER_BLOB_FD_TYPE_* as libkrun's bindings (and so its export_blob match) have them."""
    stand_in = trees.pin_of("libkrun")["standin_tarball"]  # v1.19.3's tree is out of reach here
    tree = trees.unpack(upstream / stand_in["file"], work / "libkrun", stand_in["hash"])
    found = {k: int(v) for k, v in RUST_CONST.findall((tree / BINDINGS).read_text())}
    if "VIRGL_RENDERER_BLOB_FD_TYPE_APPLE" not in found:
        raise trees.TreeError(f"{BINDINGS}: no VIRGL_RENDERER_BLOB_FD_TYPE_APPLE; the check's reading is stale")
    return found


def header_handle_types(header: Path) -> dict[str, int]:
    return {k: int(v, 0) for k, v in C_DEFINE.findall(header.read_text())}


def judge(result: dict[str, Any], dylib: Path, header: Path, calls: list[str], types: dict[str, int]) -> None:
    problems: list[str] = result["problems"]
    try:
        image = macho.parse(dylib.read_bytes() if dylib.exists() else b"")
    except macho.MachOError as exc:
        problems.append(f"{dylib.name}: {exc}")
        return
    if not image.is_arm64_dylib:
        problems.append(f"{dylib.name}: cputype {image.cputype:#x} filetype {image.filetype}, not an arm64 dylib")
    missing = sorted(set(calls) - image.exported)
    result["missing_exports"] = missing
    if missing:
        problems.append(f"exports none of {missing}, which libkrun calls on macOS")
    have = header_handle_types(header)
    wrong = {k: v for k, v in types.items() if have.get(k) != v}
    result["handle_types"] = have
    if wrong:
        problems.append(f"{header.name}: blob handle types {wrong} as libkrun maps them are missing or differ: {have}")
    result["exported_count"] = len(image.exported)


def check(name: str, upstream: Path, work: Path, log: Path) -> dict[str, Any]:
    tree_spec = trees.DARWIN_TREES[name]
    pin = trees.pin_of(tree_spec.pin)
    result: dict[str, Any] = {
        "tree": name,
        "rev": pin["rev"],
        "meson_flags": list(tree_spec.meson_flags),
        "meson_options": list(trees.NIX_MESON_OPTIONS),
        "problems": [],
        "undefined": [],
        "failed_targets": [],
    }
    src = trees.unpack(upstream / pin["upstream_tarball"], work / "src", pin["hash"])
    result["patches"] = trees.apply_patches(src, tree_spec.patch_list(pin), log)
    if tree_spec.moltenvk_rule:
        result["moltenvk_path"] = trees.moltenvk_standin()
        trees.substitute(src, tree_spec.moltenvk_rule, result["moltenvk_path"], log)
    tools = toolchain.wrappers(work / "bin")
    prefix = work / "deps"
    toolchain.epoxy_standin(prefix, tools, log)
    toolchain.sdk_header_gaps(prefix / "include")
    cross = toolchain.cross_file(work, tools, prefix)
    build = work / "build"
    rc = toolchain.run(
        [
            toolchain.meson(),
            "setup",
            str(build),
            str(src),
            "--cross-file",
            str(cross),
            *trees.NIX_MESON_OPTIONS,
            *tree_spec.meson_flags,
        ],
        cwd=work,  # meson's linker probe (`zig cc -Wl,--version`) leaves an a.o in its cwd
        log=log,
    )
    if rc != 0:
        result["problems"].append(f"meson setup failed (rc {rc})")
        return result
    defaults = targets.default_targets(build)
    # What the compiler is told, not what the buildtype suggests: the tree's b_ndebug=if-release
    # with buildtype plain defines NDEBUG in meson (release and plain alike), as in the Nix build.
    result["ndebug"] = targets.defines_ndebug(build, tree_spec.library)
    start = log.stat().st_size
    # -k 0: keep going past failures, so every target's own errors are in the log
    result["build_rc"] = toolchain.run(["ninja", "-C", str(build), "-k", "0", f"-j{os.cpu_count() or 1}"], log=log)
    ninja_log = log.read_text("utf-8", "replace")[start:]
    result["targets"] = targets.judge(build, defaults, ninja_log)
    result["failed_targets"] = sorted(t for t, r in result["targets"].items() if not r["built"])
    if result["build_rc"] != 0 and not result["failed_targets"]:
        result["problems"].append(f"ninja failed (rc {result['build_rc']}) but no default target is missing")
    if tree_spec.library not in result["targets"]:
        result["problems"].append(f"{tree_spec.library} is not a default target of this tree")
    library = result["targets"].get(tree_spec.library, {"built": False, "errors": []})
    result["link_rc"] = 0 if library["built"] else 1
    result["undefined"] = sorted({macho.c_name(s) for s in UNDEFINED.findall(ninja_log)})
    if not library["built"]:
        result["problems"].append(
            f"{tree_spec.library} failed" + (f": undefined {result['undefined']}" if result["undefined"] else "")
        )
    judge(
        result,
        build / tree_spec.library,
        src / tree_spec.header,
        libkrun_macos_calls(),
        libkrun_handle_types(upstream, work),
    )
    return result


def cached_check(name: str, upstream: Path, cache: Path, fresh: bool = False) -> dict[str, Any]:
    """The result for `name`, from cache/<pin>-<key>.json when every input of the build is unchanged
    (trees.cache_key); two names with the same inputs share one build, each named in its result."""
    tree_spec = trees.DARWIN_TREES[name]
    key = trees.cache_key(tree_spec, trees.pin_of(tree_spec.pin), toolchain.inputs_key())
    result = trees.cached_result(
        cache, f"{tree_spec.pin}-{key}", fresh, lambda work, log: check(name, upstream, work, log)
    )
    result["tree"] = name
    return result
