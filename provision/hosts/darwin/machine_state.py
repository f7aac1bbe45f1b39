"""Which route a podman machine was last started with (krunkit inherits podman's env at
start, so the route is fixed until the next restart). One small JSON file per machine,
written atomically; ``PROVISION_STATE`` overrides the directory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from provision.core import paths, values


def state_dir() -> Path:
    return paths.state_root()


def state_file(machine: str) -> Path:
    return state_dir() / "machines" / f"{values.machine_name(machine)}.json"


def recorded_route(machine: str) -> str | None:
    try:
        data = json.loads(state_file(machine).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    route = data.get("route") if isinstance(data, dict) else None
    return route if isinstance(route, str) else None


def record_route(machine: str, route: str, *, virglrenderer: str | None) -> Path:
    path = state_file(machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{machine}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"machine": machine, "route": route, "virglrenderer": virglrenderer}, fh, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path
