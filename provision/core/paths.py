"""Where provision keeps its caches: one root, overridable with PROVISION_CACHE."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_root() -> Path:
    override = os.environ.get("PROVISION_CACHE")
    root = Path(override) if override else Path(platformdirs.user_cache_dir("krun-gpu"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(*parts: str) -> Path:
    path = cache_root().joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
