"""libkrun (virgl calls per OS, Makefile release steps) and krunkit (links, Makefile, firmware)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .trees import FactsError, Tree

OSES = ("linux", "macos")


def parse_cfg(text: str) -> Any:
    """`cfg(...)` predicate text -> nested lists: ["feature", "x"], ["not", p], ["any", ...]."""
    tokens = re.findall(r'\w+|"[^"]*"|[(),=]', text)
    pos = 0

    def pred() -> Any:
        nonlocal pos
        word = tokens[pos]
        pos += 1
        if word in ("not", "any", "all"):
            pos += 1  # (
            items = []
            while tokens[pos] != ")":
                items.append(pred())
                if tokens[pos] == ",":
                    pos += 1
            pos += 1
            return [word, *items]
        if pos < len(tokens) and tokens[pos] == "=":
            pos += 2
            return [word, tokens[pos - 1].strip('"')]
        return [word]

    return pred()


def eval_cfg(p: Any, os: str, features: set[str]) -> bool:
    head = p[0]
    if head == "not":
        return not eval_cfg(p[1], os, features)
    if head == "any":
        return any(eval_cfg(q, os, features) for q in p[1:])
    if head == "all":
        return all(eval_cfg(q, os, features) for q in p[1:])
    if head == "feature":
        return p[1] in features
    if head == "target_os":
        return p[1] == os
    if head == "target_arch":
        return p[1] == "aarch64"  # the arm64 Mac and the arm64/x86_64 Linux hosts share the gpu code
    return False


def cargo_features(tree: Tree) -> list[dict[str, Any]]:
    """The features src/devices turns on in rutabaga_gfx, per Cargo.toml section."""
    file = "src/devices/Cargo.toml"
    section, found = "", []
    for n, line in enumerate((tree.show(file) or "").splitlines(), 1):
        if line.startswith("["):
            section = line.strip()
        elif line.startswith("rutabaga_gfx") and (m := re.search(r"features\s*=\s*\[([^\]]*)\]", line)):
            found.append(tree.where(file, n, section=section, features=sorted(re.findall(r'"([^"]+)"', m.group(1)))))
    return found


def section_applies(section: str, os: str) -> bool:
    m = re.search(r"cfg\((.*)\)'", section)
    return m is None or eval_cfg(parse_cfg(m.group(1)), os, set())


BINDINGS_DIR = "src/rutabaga_gfx/src/generated"
FFI_FN = re.compile(r"\bpub fn (virgl_\w+)\s*\(")


def virgl_ffi_names(tree: Tree) -> list[str]:
    """The virglrenderer functions rutabaga declares in its generated bindings (virgl_renderer_*
    and virgl_set_debug_callback alike): the names a call in its code can link to."""
    names = {
        n
        for f in tree.files(BINDINGS_DIR)
        if Path(f).name.startswith("virgl_") and f.endswith(".rs")
        for n in FFI_FN.findall(tree.show(f) or "")
    }
    if not names:
        raise FactsError(
            f"{tree.name}: no virgl function declared under {BINDINGS_DIR}\nfix: the reading is stale; update"
            " checks/upstream_facts/krun.py"
        )
    return sorted(names)


def rust_calls(tree: Tree, file: str, names: list[str]) -> list[dict[str, Any]]:
    """Calls of `names` with the cfg predicates around them (attribute scope by bracket depth)."""
    call = re.compile(r"(?<!fn )\b(" + "|".join(map(re.escape, names)) + r")\s*\(")
    calls: list[dict[str, Any]] = []
    guards: list[tuple[Any, int]] = []
    pending: list[Any] = []
    file_guard: list[Any] = []
    depth, attr = 0, ""
    for n, raw in enumerate((tree.show(file) or "").splitlines(), 1):
        code = re.sub(r"//.*", "", raw)
        s = code.strip()
        if attr or s.startswith(("#[cfg(", "#![cfg(")):
            attr += s
            if attr.count("[") == attr.count("]"):
                predicate = parse_cfg(attr[attr.index("cfg(") + 4 : attr.rindex(")")])
                (file_guard if attr.startswith("#!") else pending).append(predicate)
                attr = ""
            continue
        if not s or s.startswith("#["):
            continue
        active = [g for g, _ in guards] + pending
        for m in call.finditer(code):
            calls.append(tree.where(file, n, name=m.group(1), cfg=file_guard + active))
        start = depth
        depth += sum(code.count(c) for c in "({[") - sum(code.count(c) for c in ")}]")
        if pending and depth > start:
            guards.append((pending[0] if len(pending) == 1 else ["all", *pending], start))
        pending = []
        while guards and depth <= guards[-1][1]:
            guards.pop()
    return calls


def libkrun_facts(tree: Tree, info: dict[str, Any]) -> dict[str, Any]:
    features = cargo_features(tree)
    names = virgl_ffi_names(tree)
    calls = []
    for file in tree.files("src"):
        if file.endswith(".rs") and "/generated/" not in file:
            calls += rust_calls(tree, file, names)
    per_os = {}
    for os in OSES:
        on = {f for entry in features if section_applies(entry["section"], os) for f in entry["features"]}
        per_os[os] = sorted({c["name"] for c in calls if all(eval_cfg(p, os, on) for p in c["cfg"])})
    return {
        **info,
        "rutabaga_features": features,
        "virgl_calls": calls,
        "virgl_calls_per_os": per_os,
        "makefile": makefile_facts(tree),
    }


def makefile_facts(tree: Tree) -> dict[str, Any]:
    """The release rule's head and its `mv` steps, and the variables its file names are made of,
    each with the make conditionals (ifeq …) around it."""
    stack: list[dict[str, Any]] = []
    rule, heads, moves, variables = "", [], [], []
    for n, line in enumerate((tree.show("Makefile") or "").splitlines(), 1):
        s = line.strip()
        if m := re.match(r"(ifeq|ifneq)\s+(.+)$", s):
            stack.append({"test": m.group(1), "args": m.group(2), "negate": False})
            continue
        if s == "else" and stack:
            stack[-1] = {**stack[-1], "negate": True}
            continue
        if s == "endif" and stack:
            stack.pop()
            continue
        if not line.startswith("\t") and (m := re.match(r"([^\s:=#][^:=]*):(?!=)(.*)$", line)):
            rule = m.group(1).strip()
            if rule == "$(LIBRARY_RELEASE_$(OS))":
                heads.append(tree.where("Makefile", n, text=line.rstrip()))
            continue
        if line.startswith("\t") and rule == "$(LIBRARY_RELEASE_$(OS))" and s.startswith("mv "):
            moves.append(tree.where("Makefile", n, command=s, conditions=list(stack)))
        elif m := re.match(r"(VARIANT|KRUN_BASE_Darwin|KRUN_BASE_Linux)\s*[:?]?=\s*(.*)$", s):
            variables.append(tree.where("Makefile", n, name=m.group(1), value=m.group(2), conditions=list(stack)))
    return {"release_rule": heads, "release_mv": moves, "variables": variables}


def krunkit_facts(tree: Tree, info: dict[str, Any]) -> dict[str, Any]:
    links, firmware = [], []
    for file in tree.files("src"):
        for n, line in enumerate((tree.show(file) or "").splitlines(), 1):
            links += [tree.where(file, n, name=v) for v in re.findall(r'#\[link\(name = "([^"]+)"\)\]', line)]
            firmware += [tree.where(file, n, path=v) for v in re.findall(r'join\("([^"]*KRUN_EFI[^"]*)"\)', line)]
    make = tree.show("Makefile") or ""
    steps = [
        tree.where("Makefile", n, command=line.strip())
        for n, line in enumerate(make.splitlines(), 1)
        if line.startswith("\t") and line.strip().split()[0] in ("install_name_tool", "codesign", "install")
    ]
    variables = [
        tree.where("Makefile", n, name=m.group(1), value=m.group(2))
        for n, line in enumerate(make.splitlines(), 1)
        if (m := re.match(r"(LIBKRUN|PREFIX)\s*\??=\s*(.*)$", line))
    ]
    cargo = tree.show("Cargo.toml") or ""
    version = re.search(r'^version\s*=\s*"([^"]+)"', cargo, re.M)
    shipped = [f for f in tree.files("edk2") if f.endswith(".fd")]
    return {
        **info,
        "version": version.group(1) if version else None,
        "links": sorted(links, key=lambda x: (x["file"], x["line"])),
        "firmware_lookup": firmware,
        "firmware_in_tree": shipped,
        "makefile_steps": steps,
        "makefile_variables": variables,
    }
