"""Kept for callers not yet moved to the runner: ``run_tool`` is ``provision.adapters.runner.probe``."""

from __future__ import annotations

from provision.adapters.runner import probe as run_tool

__all__ = ["run_tool"]
