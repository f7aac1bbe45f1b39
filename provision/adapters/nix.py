"""nix (Debian's nix-bin is enough): content hashes of source trees, as fetchers compute them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from provision.core.errors import ToolMissing

FEATURES = ["--extra-experimental-features", "nix-command flakes"]


def hash_path(path: Path) -> str:
    """SRI sha256 of the NAR serialisation of ``path`` (what fetchFromGitHub pins)."""
    if shutil.which("nix") is None:
        raise ToolMissing("nix is not installed", fix="apt-get install nix-bin (scripts/setup-debian does)")
    proc = subprocess.run(
        ["nix", *FEATURES, "hash", "path", "--type", "sha256", "--sri", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolMissing(f"nix hash path {path} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()
