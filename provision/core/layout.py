"""Where the project's own non-Python files live (templates, patches).

They sit beside the package in the source tree (containerfiles/, patches/), which is how
both Nix and pip (editable) installs run provision; PROVISION_DATA_ROOT points elsewhere
for a relocated install (the Nix package sets it to its share/ directory).
"""

from __future__ import annotations

from pathlib import Path

from provision.core import settings


def data_root(given: settings.Settings | None = None) -> Path:
    """The setting ``data_root`` (default: beside the package, as in the source tree)."""
    return (given or settings.current()).typed.data_root


def templates_dir() -> Path:
    return data_root() / "containerfiles"


def patches_dir() -> Path:
    return data_root() / "patches"
