"""nixpkgs package files: argument sets (through nix-instantiate) and what moltenvk installs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from .trees import FactsError

NIXPKGS_PACKAGES = {
    "krunkit": "pkgs/by-name/kr/krunkit/package.nix",
    "libkrun": "pkgs/by-name/li/libkrun/package.nix",
    "libkrun-efi": "pkgs/by-name/li/libkrun-efi/package.nix",
    "llama-cpp": "pkgs/by-name/ll/llama-cpp/package.nix",
    "moltenvk": "pkgs/by-name/mo/moltenvk/package.nix",
    "virglrenderer": "pkgs/by-name/vi/virglrenderer/package.nix",
}


def function_args(path: Path) -> dict[str, bool]:
    proc = subprocess.run(
        ["nix-instantiate", "--eval", "--strict", "--json", "--expr", f"builtins.functionArgs (import {path})"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise FactsError(f"nix-instantiate could not read the arguments of {path.name}: {proc.stderr.strip()}")
    return dict(json.loads(proc.stdout))


def nixpkgs_facts(folder: Path, pin: dict[str, Any]) -> dict[str, Any]:
    manifest = folder / "COMMITS.json"
    if not manifest.exists():
        raise FactsError(f'--nixpkgs: {manifest.name} missing\nfix: write {{"<file>": "<commit it was read from>"}}')
    commits = json.loads(manifest.read_text())
    packages = {}
    for name, rel in sorted(NIXPKGS_PACKAGES.items()):
        path = folder / rel
        if not path.exists():
            raise FactsError(f"--nixpkgs: {rel} missing\nfix: save the file read from NixOS/nixpkgs there")
        text = path.read_text()
        formals = text[: text.index("}:")]
        args = {}
        for arg, has_default in sorted(function_args(path).items()):
            m = re.search(rf"^\s*,?\s*{re.escape(arg)}\b", formals, re.M)
            args[arg] = {"default": has_default, "line": formals.count("\n", 0, m.start()) + 1 if m else None}
        version = re.search(r'version = "([^"]+)";', text)
        outputs = re.search(r"outputs = \[([^\]]*)\]", text)
        commit = commits.get(rel)
        packages[name] = {
            "tree": "nixpkgs",
            "rev": commit,
            "file": rel,
            "is_locked_rev": commit == pin["rev"],
            "version": version.group(1) if version else None,
            "outputs": re.findall(r'"(\w+)"', outputs.group(1)) if outputs else ["out"],
            "arguments": args,
        }
        if name == "moltenvk":
            packages[name]["installs"] = installs(text, rel, commit)
    return {"locked_rev": pin["rev"], "packages": packages}


def installs(text: str, rel: str, commit: str | None) -> dict[str, Any]:
    """What moltenvk's installPhase puts where, its install name, and whether any .pc file ships."""
    start = text[: text.index("installPhase")].count("\n") + 1
    end = start + text[text.index("installPhase") :].index("\n  '';")
    found = []
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        s = line.strip()
        k = n
        while s.endswith("\\") and k < len(lines):  # a command continued on the next line
            s = s[:-1] + " " + lines[k].strip()
            k += 1
        if start <= n <= end and re.match(r"(cp|install)\b", s) and (dest := re.search(r'"(\$\w+[^"]*)"\s*$', s)):
            source = s.split()[-2].strip('"')
            found.append({"rev": commit, "file": rel, "line": n, "source": source, "dest": dest.group(1)})
    name = re.search(r'-install_name "([^"]+)"', text)
    return {
        "files": found,
        "install_name": name.group(1) if name else None,
        "pkg_config": bool(re.search(r"pkgconfig|\.pc\b", text)),
        "libvulkan": "libvulkan" in text,
    }
