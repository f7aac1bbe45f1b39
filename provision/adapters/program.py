"""Run one outside program and capture what it said (for probes and checks, not long builds)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def run_tool(
    argv: Sequence[str], *, timeout: float = 30.0, env: dict[str, str] | None = None
) -> tuple[int, str] | None:
    """(exit status, stdout+stderr), or None when the program is not installed."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except FileNotFoundError:
        return None
    except subprocess.TimeoutExpired:
        return (124, f"{argv[0]} did not finish within {timeout:.0f} s")
    return proc.returncode, proc.stdout + proc.stderr
