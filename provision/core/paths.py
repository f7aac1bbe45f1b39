"""Where provision keeps its caches: one root, overridable with PROVISION_CACHE."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from provision.core.errors import InvalidValue

CACHE_ENV = "PROVISION_CACHE"


def _unusable(path: Path, why: str) -> InvalidValue:
    source = f"{CACHE_ENV}={os.environ[CACHE_ENV]!r}" if os.environ.get(CACHE_ENV) else "the default cache"
    return InvalidValue(
        f"cache directory {path} ({source}) cannot be used: {why}",
        fix=f"set {CACHE_ENV} to a writable directory (or make {path} one)",
    )


def _make_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _unusable(path, "it exists and is not a directory") from None
    except OSError as exc:
        raise _unusable(path, exc.strerror or str(exc)) from None
    if not path.is_dir():
        raise _unusable(path, "it is not a directory")
    # access() reports a read-only filesystem (EROFS) even to root, before any write half-happens.
    if not os.access(path, os.W_OK | os.X_OK):
        raise _unusable(path, "it is not writable (read-only filesystem or permissions)")
    return path


def cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override and "\0" in override:
        raise _unusable(Path(override.replace("\0", "\\0")), "the value is not a path")
    root = Path(override).expanduser() if override else Path(platformdirs.user_cache_dir("krun-gpu"))
    return _make_dir(root)


def cache_dir(*parts: str) -> Path:
    return _make_dir(cache_root().joinpath(*parts))
