"""Running Debian's nix (2.8) against this repository's flake with the stub nixpkgs.

Real nixpkgs needs nix >= 2.18, so every flake evaluation here overrides the `nixpkgs` input with
nix/tests/stub-nixpkgs (a test double with nixpkgs' names and calling conventions). `path:` URLs
avoid git-tracking rules; the lock file is never rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
STUB = REPO / "nix" / "tests" / "stub-nixpkgs"
FEATURES = ["--extra-experimental-features", "nix-command flakes"]
DARWIN = "aarch64-darwin"
LINUX = "x86_64-linux"


def nix_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    # nix writes its eval/fetcher caches under HOME/XDG dirs; keep them out of the real home.
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"), XDG_CONFIG_HOME=str(home / "config"))
    env.pop("NIX_PATH", None)
    return env


# What the flake reads. `path:` flakes are copied whole into the store, so evaluating the checkout
# itself would copy .venv and caches every time; a copy of just these is evaluated instead.
FLAKE_FILES = ("flake.nix", "flake.lock", "pyproject.toml", "README.md", "nix", "patches", "provision")


def copy_flake(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for rel in FLAKE_FILES:
        src = REPO / rel
        target = dest / rel
        if src.is_dir():
            shutil.copytree(src, target, ignore=ignore)
        elif src.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def require(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} not found: run scripts/setup-debian (it installs nix-bin)"
    return path


class Nix:
    def __init__(self, home: Path, repo: Path) -> None:
        self.env = nix_env(home)
        self.repo = repo
        self.nix = require("nix")

    @property
    def flake(self) -> str:
        return f"path:{self.repo}"

    def override(self) -> list[str]:
        return ["--override-input", "nixpkgs", f"path:{STUB}", "--no-write-lock-file"]

    def store_args(self) -> list[str]:
        # CI runs as root with Debian's single-user /nix. Anyone else cannot write /nix/var/nix
        # (nix 2.8 then tries the daemon socket and fails): give them a private chroot store.
        if os.access("/nix/var/nix/db", os.W_OK):
            return []
        return ["--store", f"local?root={self.env['HOME']}/store"]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [self.nix, *FEATURES, *self.store_args(), *args]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=240)
        if check and proc.returncode != 0:
            raise AssertionError(f"nix {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def eval(self, attr: str, apply: str | None = None) -> Any:
        args = ["eval", "--json", f"{self.flake}#{attr}", *self.override()]
        if apply:
            args += ["--apply", apply]
        return json.loads(self.run(*args).stdout)

    def eval_error(self, attr: str, apply: str | None = None) -> str:
        args = ["eval", "--json", f"{self.flake}#{attr}", *self.override()]
        if apply:
            args += ["--apply", apply]
        proc = self.run(*args, check=False)
        assert proc.returncode != 0, f"{attr} evaluated, expected an error:\n{proc.stdout}"
        return proc.stderr
