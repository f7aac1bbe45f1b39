"""Host backends: how `provision run` reaches a guest on this machine.

A host package (``darwin``, ``linux``) has a ``backend`` module exposing ``backend() -> HostBackend``.
``native_backend()`` picks the module for the running platform. The Protocol is kept
minimal so each route can grow its own extras (``DarwinBackend.launch`` …) beside it.
May import core and the domain packages (models, images, apir) and adapters; never the CLI.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from provision.core.catalog import Stack
from provision.core.errors import WrongPlatform
from provision.core.isolation import GuestLimits


@runtime_checkable
class HostBackend(Protocol):
    name: str
    limits: GuestLimits  # memory/CPUs/pids for the guests `run` starts (provision/core/isolation.py)

    def run(
        self,
        stack: Stack,
        gpu: bool,
        model_path: Path | None,
        command: Sequence[str],
        timeout: float | None,
        route: str | None,
    ) -> int:
        """Run ``command`` in a guest of ``stack``; return the command's exit status.

        Raises GpuNotSupported (E007) before anything starts when ``gpu`` is asked of a
        stack without GPU, and RunTimeout (E021) when ``timeout`` seconds pass.
        """
        ...


def module_for(platform: str) -> str:
    if platform == "darwin":
        return "darwin"
    if platform.startswith("linux"):
        return "linux"
    raise WrongPlatform(f"no host backend for platform {platform!r}", fix="use macOS (Apple Silicon) or Linux")


def native_backend(platform: str | None = None) -> HostBackend:
    name = module_for(platform or sys.platform)
    module = f"{__name__}.{name}.backend"
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name not in (module, f"{__name__}.{name}"):
            raise
        raise WrongPlatform(
            f"the {name} host backend is not part of this build", fix="install the full krun-gpu"
        ) from None
    backend: HostBackend = mod.backend()
    return backend
