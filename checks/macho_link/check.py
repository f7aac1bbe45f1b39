"""Build one darwin tree's library target for aarch64-macos and judge it: linked with undefined
symbols an error (meson's b_lundef passes -Wl,--no-undefined, which zig's linker honours), a real
arm64 Mach-O dylib, exporting every virgl function libkrun calls on macOS, and a header whose blob
handle types are the ones libkrun's macOS code maps."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from . import macho, toolchain, trees

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
    pin = trees.pin_of(name)
    result: dict[str, Any] = {
        "tree": name,
        "rev": pin["rev"],
        "meson_flags": list(tree_spec.meson_flags),
        "problems": [],
        "undefined": [],
    }
    src = trees.unpack(upstream / pin["upstream_tarball"], work / "src", pin["hash"])
    result["patches"] = trees.apply_patches(src, pin.get("patches", []), log)
    tools = toolchain.wrappers(work / "bin")
    prefix = work / "deps"
    toolchain.epoxy_standin(prefix, tools, log)
    cross = toolchain.cross_file(work, tools, prefix)
    build = work / "build"
    meson = [toolchain.meson()]
    rc = toolchain.run(
        [
            *meson,
            "setup",
            str(build),
            str(src),
            "--cross-file",
            str(cross),
            "--buildtype=release",
            "-Db_lundef=true",
            *tree_spec.meson_flags,
        ],
        log=log,
    )
    if rc != 0:
        result["problems"].append(f"meson setup failed (rc {rc})")
        return result
    rc = toolchain.run(["ninja", "-C", str(build), tree_spec.target], log=log)
    result["link_rc"] = rc
    result["undefined"] = sorted({macho.c_name(s) for s in UNDEFINED.findall(log.read_text("utf-8", "replace"))})
    if rc != 0:
        result["problems"].append(
            f"ninja {tree_spec.target} failed (rc {rc})"
            + (f": undefined {result['undefined']}" if result["undefined"] else "")
        )
    judge(
        result,
        build / tree_spec.target,
        src / tree_spec.header,
        libkrun_macos_calls(),
        libkrun_handle_types(upstream, work),
    )
    return result


def cached_check(name: str, upstream: Path, cache: Path, fresh: bool = False) -> dict[str, Any]:
    """The result for `name`, from cache/<key>.json when the pins, patches, flags and zig are unchanged."""
    tree_spec = trees.DARWIN_TREES[name]
    key = trees.cache_key(tree_spec, trees.pin_of(name), toolchain.inputs_key())
    return trees.cached_result(cache, f"{name}-{key}", fresh, lambda work, log: check(name, upstream, work, log))
