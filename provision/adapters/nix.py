"""nix (Debian's nix-bin is enough): content hashes of source trees, as fetchers compute them."""

from __future__ import annotations

from pathlib import Path

from provision.adapters import runner
from provision.core.errors import ToolMissing

FEATURES = ["--extra-experimental-features", "nix-command flakes"]


def hash_path(path: Path) -> str:
    """SRI sha256 of the NAR serialisation of ``path`` (what fetchFromGitHub pins)."""
    proc = runner.run(["nix", *FEATURES, "hash", "path", "--type", "sha256", "--sri", str(path)],
                      error=ToolMissing, what=f"nix hash path {path}",
                      missing_fix="apt-get install nix-bin (scripts/setup-debian does)")  # fmt: skip
    return proc.out.strip()
