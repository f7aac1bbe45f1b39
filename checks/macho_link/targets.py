"""A meson build's default targets and, after `ninja -k 0`, which of them were built and why not.

A target counts as built only when ninja reported no failure for it or its objects and each of its
files is what its type promises: an arm64 Mach-O dylib, bundle or executable, or an ar archive.
zig leaves empty files behind a failed link, so existence proves nothing."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from . import macho, toolchain

FAILED = re.compile(r"^FAILED: (?:\[code=\d+\] )?(.+?)\s*$")
PROGRESS = re.compile(r"^\[\d+/\d+\] ")
MH_EXECUTE = 2
MH_BUNDLE = 8
# meson introspect's target types
IMAGE_TYPES = {"shared library": macho.MH_DYLIB, "shared module": MH_BUNDLE, "executable": MH_EXECUTE}
MAX_ERRORS = 12


def default_targets(build: Path) -> dict[str, dict[str, Any]]:
    """{output path relative to build: {"name", "type", "files"}} for every target built by default."""
    proc = subprocess.run(
        [toolchain.meson(), "introspect", str(build), "--targets"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise toolchain.ToolchainError(f"meson introspect --targets failed: {proc.stderr.strip()[-500:]}")
    out: dict[str, dict[str, Any]] = {}
    for t in json.loads(proc.stdout):
        if not t.get("build_by_default"):
            continue
        files = [str(Path(f).relative_to(build)) for f in t["filename"]]
        out[files[0]] = {"name": t["name"], "type": t["type"], "files": files}
    return out


def defines_ndebug(build: Path, target: str) -> bool:
    """Whether meson compiles `target`'s sources with -DNDEBUG (assert() compiled out), read from
    the compile commands it wrote."""
    commands = json.loads((build / "compile_commands.json").read_text())
    own = [c["command"] for c in commands if c.get("output", "").startswith(target + ".p/")]
    if not own:
        raise toolchain.ToolchainError(f"compile_commands.json has no command for {target}")
    return any("-DNDEBUG" in c.split() for c in own)


def failures(ninja_log: str) -> list[tuple[list[str], list[str]]]:
    """(outputs, error lines) of each FAILED edge in ninja's output."""
    found: list[tuple[list[str], list[str]]] = []
    current: list[str] | None = None
    for line in ninja_log.splitlines():
        m = FAILED.match(line)
        if m:
            current = []
            found.append((m.group(1).split(), current))
        elif PROGRESS.match(line) or line.startswith(("ninja: ", "$ ")):
            current = None
        elif current is not None and "error:" in line and len(current) < MAX_ERRORS:
            current.append(line.strip())
    return found


def owner(output: str, targets: dict[str, dict[str, Any]]) -> str | None:
    """The target an edge's output belongs to: the target's file itself, or one of its objects
    (meson puts them under `<target file>.p/`)."""
    for key, t in targets.items():
        for f in t["files"]:
            if output == f or output.startswith(f + ".p/"):
                return key
    return None


def file_problem(path: Path, kind: str) -> str | None:
    data = path.read_bytes() if path.is_file() else b""
    if kind in IMAGE_TYPES:
        try:
            image = macho.parse(data)
        except macho.MachOError as exc:
            return f"{path.name}: {exc}"
        if image.cputype != macho.CPU_TYPE_ARM64 or image.filetype != IMAGE_TYPES[kind]:
            return f"{path.name}: cputype {image.cputype:#x} filetype {image.filetype}, not an arm64 {kind}"
        return None
    if kind == "static library":
        return None if data.startswith(b"!<arch>\n") else f"{path.name}: not an ar archive"
    return None if path.exists() else f"{path.name}: missing"


def judge(build: Path, targets: dict[str, dict[str, Any]], ninja_log: str) -> dict[str, dict[str, Any]]:
    """Per default target: built or not, the failed edges that were its own, their error lines."""
    result: dict[str, dict[str, Any]] = {
        key: {"name": t["name"], "type": t["type"], "built": True, "failed": [], "errors": []}
        for key, t in targets.items()
    }
    for outputs, errors in failures(ninja_log):
        key = owner(outputs[0], targets)
        if key is None:
            continue
        result[key]["failed"].extend(outputs)
        result[key]["errors"].extend(errors)
    for key, t in targets.items():
        problems = [p for f in t["files"] if (p := file_problem(build / f, t["type"]))]
        if problems or result[key]["failed"]:
            result[key]["built"] = False
            result[key]["file_problems"] = problems
    return result
