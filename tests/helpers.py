"""Helpers shared by the whole suite: run the CLI, edit copies of the pins file and the catalog.

Fixtures that build artifacts live in conftest.py; these are plain functions so any test module
(and the bad-input tables) can call them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from provision.core import catalog, pins

Mutate = Callable[[Any], None]


def run_provision(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m provision ARGS` as a real process (its exit status and output as a user sees them)."""
    return subprocess.run(
        [sys.executable, "-m", "provision", *args],
        capture_output=True,
        text=True,
        errors="replace",  # a random model's tokens are not always valid UTF-8
        timeout=timeout,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def pins_file_with(tmp_path: Path, mutate: Mutate) -> Path:
    """A copy of the pins file, changed by ``mutate(data)``."""
    data = json.loads(pins.default_path().read_text())
    mutate(data)
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    return path


def pins_with(tmp_path: Path, mutate: Mutate) -> pins.Pins:
    return pins.load(pins_file_with(tmp_path, mutate))


def catalog_file_with(tmp_path: Path, mutate: Mutate) -> Path:
    """A copy of the stack catalog, changed by ``mutate(data)``."""
    data = yaml.safe_load(catalog.default_path().read_text())
    mutate(data)
    path = tmp_path / "stacks.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def gone(pid: int) -> bool:
    """No process has ``pid`` any more (a zombie still counts as there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
