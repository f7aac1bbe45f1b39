"""virglrenderer trees: meson options and dependencies, exported functions, strings; our patches."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from .trees import REPO, FactsError, Tree

OPTION = re.compile(r"^option\(", re.M)


def meson_value(text: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("["):
        return [meson_value(v) for v in re.findall(r"'[^']*'|\btrue\b|\bfalse\b|-?\d+", text)]
    if text.startswith("'"):
        inner = text[1:-1]
        return inner == "true" if inner in ("true", "false") else inner
    return int(text) if re.fullmatch(r"-?\d+", text) else text


def meson_options(tree: Tree) -> list[dict[str, Any]]:
    file = "meson_options.txt" if tree.show("meson_options.txt") is not None else "meson.options"
    text = tree.show(file) or ""
    found = []
    for m in OPTION.finditer(text):
        depth, i = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        body = text[m.end() : i]
        name = re.match(r"\s*'([^']+)'", body)
        kind = re.search(r"type\s*:\s*'(\w+)'", body)
        if not name or not kind:
            continue
        value = re.search(r"value\s*:\s*(\[[^\]]*\]|'[^']*'|\w+)", body)
        choices = re.search(r"choices\s*:\s*(\[[^\]]*\])", body)
        option: dict[str, Any] = {"name": name.group(1), "type": kind.group(1)}
        option["default"] = meson_value(value.group(1)) if value else None
        if choices:
            option["choices"] = meson_value(choices.group(1))
        option["deprecated"] = "DEPRECATED" in body
        found.append(tree.where(file, text.count("\n", 0, m.start()) + 1, **option))
    return sorted(found, key=lambda o: o["name"])


def meson_structure(tree: Tree, file: str) -> dict[str, list[dict[str, Any]]]:
    """dependency() calls, `with_x = …` assignments and `virgl_sources += …` lines, each with the
    chain of if/elif/else conditions around it (as text; tests evaluate them)."""
    text = tree.show(file) or ""
    stack: list[list[dict[str, Any]]] = []  # per open `if`: the conditions of its branches so far
    deps, assigns, sources = [], [], []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if m := re.match(r"if\s+(.+)$", line):
            stack.append([{"expr": m.group(1), "negate": False}])
            continue
        if m := re.match(r"elif\s+(.+)$", line):
            prior = [{**c, "negate": True} for c in stack[-1] if not c["negate"]]
            stack[-1] = prior + [{"expr": m.group(1), "negate": False}]
            continue
        if line == "else":
            stack[-1] = [{**c, "negate": True} for c in stack[-1] if not c["negate"]]
            continue
        if line == "endif":
            stack.pop()
            continue
        conditions = [c for branch in stack for c in branch]
        for m in re.finditer(r"\bdependency\('([^']*)'", line):
            rest, depth, end = line[m.end() :], 1, 0
            while end < len(rest) and depth:
                depth += {"(": 1, ")": -1}.get(rest[end], 0)
                end += 1
            required = re.search(r"required\s*:\s*(.+?)\s*(?:,\s*\w+\s*:|$)", rest[: end - 1])
            deps.append(
                tree.where(
                    file,
                    n,
                    name=m.group(1),
                    conditions=conditions,
                    required=required.group(1).strip() if required else None,
                )
            )
        if m := re.match(r"(with_\w+)\s*=\s*(.+)$", line):
            assigns.append(tree.where(file, n, name=m.group(1), expr=m.group(2), conditions=conditions))
        if m := re.match(r"virgl_sources\s*\+=\s*(\w+)", line):
            sources.append(tree.where(file, n, name=m.group(1), conditions=conditions))
    return {"dependencies": deps, "assignments": assigns, "source_lists": sources}


# virgl_*: the header exports virgl_set_debug_callback too, which libkrun calls.
EXPORT = re.compile(r"VIRGL_EXPORT\b[^;(]*?\b(virgl_\w+)\s*\(", re.S)
DEFINITION = re.compile(r"^(?!static\b)(?:[A-Za-z_][\w \t*]*\n?)?(virgl_\w+)\s*\(([^;{]*)\)\s*\{", re.M)


def exported_definitions(header: str, sources: dict[str, str]) -> dict[str, tuple[str, int]]:
    """virgl_* functions that the .c files define and virglrenderer.h exports (the library
    is built with -fvisibility=hidden, so only VIRGL_EXPORT ones can be linked against)."""
    exported = set(EXPORT.findall(header))
    found: dict[str, tuple[str, int]] = {}
    for file in sorted(sources):
        text = sources[file]
        for m in DEFINITION.finditer(text):
            if m.group(1) in exported and m.group(1) not in found:
                found[m.group(1)] = (file, text.count("\n", 0, m.start(1)) + 1)
    return found


def exported_functions(tree: Tree) -> list[dict[str, Any]]:
    sources = {f: tree.show(f) or "" for f in tree.files("src") if f.endswith(".c")}
    found = exported_definitions(tree.show("src/virglrenderer.h") or "", sources)
    return [tree.where(file, line, name=name) for name, (file, line) in sorted(found.items())]


def string_facts(tree: Tree) -> dict[str, list[dict[str, Any]]]:
    getenvs, dlopens = [], []
    for file in tree.files("src"):
        if not file.endswith(".c"):
            continue
        for n, line in enumerate((tree.show(file) or "").splitlines(), 1):
            getenvs += [tree.where(file, n, name=v) for v in re.findall(r'getenv\("([^"]+)"\)', line)]
            dlopens += [tree.where(file, n, name=v) for v in re.findall(r'dlopen\("([^"]+)"', line)]
    header = tree.show("src/virglrenderer.h") or ""
    defines = [
        tree.where("src/virglrenderer.h", n, name=m.group(1))
        for n, line in enumerate(header.splitlines(), 1)
        if (m := re.match(r"#define\s+(VIRGL_RENDERER_\w+)", line))
    ]
    return {"getenv": getenvs, "dlopen": dlopens, "header_defines": defines}


def virgl_facts(tree: Tree, info: dict[str, Any]) -> dict[str, Any]:
    meson = tree.show("meson.build") or ""
    version = re.search(r"version\s*:\s*'([^']+)'", meson)
    return {
        **info,
        "meson_version": version.group(1) if version else None,
        "options": meson_options(tree),
        "meson": {f: meson_structure(tree, f) for f in ("meson.build", "src/meson.build")},
        "functions": exported_functions(tree),
        "strings": string_facts(tree),
    }


def patch_facts(
    tree: Tree, patches: list[str], fixes: list[str], read_fixes: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Apply the pin's patches (git apply --check, then apply) to the touched files of the tree.
    Comparing with upstream's fix commits needs their history: a tree without it (an archive) is
    given the fixes as read before (read_fixes), kept only while they name this tree and these commits."""
    result: dict[str, Any] = {"patches": [], "fixes": [], "adds_functions": []}
    if not patches:
        return result
    texts = [(p, (REPO / p).read_bytes()) for p in patches]
    touched = sorted({m for _, t in texts for m in re.findall(r"^\+\+\+ b/(\S+)", t.decode(), re.M)})
    if read_fixes is not None:
        if sorted(f["commit"] for f in read_fixes) != sorted(fixes) or any(f["rev"] != tree.rev for f in read_fixes):
            raise FactsError(
                f"{tree.name}: the fixes read before are not for {tree.rev[:8]} and {sorted(fixes)}\n"
                "fix: regenerate with a clone that has the fix commits (docs/nix.md)"
            )
        result["fixes"] = read_fixes
        fixes = []
    fix_files = {c: tree.git("diff-tree", "--no-commit-id", "--name-only", "-r", c).split() for c in fixes}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for file in sorted(set(touched) | {f for fs in fix_files.values() for f in fs}):
            content = tree.show_bytes(file)
            if content is not None:
                (root / file).parent.mkdir(parents=True, exist_ok=True)
                (root / file).write_bytes(content)
        before = exported_in(root)
        for rel, text in texts:
            check = subprocess.run(["git", "apply", "--check", "-"], input=text, cwd=root, capture_output=True)
            applied = (
                check.returncode == 0 and subprocess.run(["git", "apply", "-"], input=text, cwd=root).returncode == 0
            )
            result["patches"].append(
                {
                    "patch": rel,
                    "sha256": hashlib.sha256(text).hexdigest(),
                    "tree": tree.name,
                    "rev": tree.rev,
                    "applies": applied,
                    "files": sorted(re.findall(r"^\+\+\+ b/(\S+)", text.decode(), re.M)),
                }
            )
        added = sorted(exported_in(root) - before)
        result["adds_functions"] = added
        for commit, files in sorted(fix_files.items()):
            same = {}
            for file in files:
                upstream = subprocess.run(
                    ["git", "-C", str(tree.path), "show", f"{commit}:{file}"], capture_output=True
                )
                same[file] = (root / file).exists() and (root / file).read_bytes() == upstream.stdout
            result["fixes"].append(
                {"commit": commit, "tree": tree.name, "rev": tree.rev, "identical_after_patches": same}
            )
    return result


def exported_in(root: Path) -> set[str]:
    header = root / "src" / "virglrenderer.h"
    sources = {str(c.relative_to(root)): c.read_text() for c in sorted((root / "src").rglob("*.c"))}
    return set(exported_definitions(header.read_text() if header.exists() else "", sources))
