"""``podman machine`` as argv lists, and parsers for the JSON it prints.

Shapes (podman 5.x): ``machine list --format json`` is a list of ListReporter objects
(Name, Default, Running, Starting, VMType, CPUs, Memory as a byte-count string, …);
``machine inspect`` is a list of InspectInfo objects (Name, State "running"/"stopped",
Resources {CPUs, Memory in MiB, DiskSize in GiB}, ConnectionInfo …). The provider is chosen
by the environment (CONTAINERS_MACHINE_PROVIDER), so every command runs with the plan's env.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from provision.core.errors import MachineFailed

DEFAULT_MACHINE = "podman-machine-default"


@dataclass(frozen=True)
class MachineInfo:
    name: str
    running: bool
    vm_type: str | None
    cpus: int | None
    memory_mib: int | None
    default: bool = False


def version_cmd() -> list[str]:
    return ["podman", "--version"]


def inspect_cmd(name: str) -> list[str]:
    return ["podman", "machine", "inspect", name]


def init_cmd(name: str, *, cpus: int | None, memory_mib: int | None) -> list[str]:
    argv = ["podman", "machine", "init"]
    if cpus is not None:
        argv += ["--cpus", str(cpus)]
    if memory_mib is not None:
        argv += ["--memory", str(memory_mib)]
    return [*argv, name]


def set_cmd(name: str, *, cpus: int | None, memory_mib: int | None) -> list[str]:
    argv = ["podman", "machine", "set"]
    if cpus is not None:
        argv += ["--cpus", str(cpus)]
    if memory_mib is not None:
        argv += ["--memory", str(memory_mib)]
    return [*argv, name]


def start_cmd(name: str) -> list[str]:
    return ["podman", "machine", "start", name]


def stop_cmd(name: str) -> list[str]:
    return ["podman", "machine", "stop", name]


def _int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rows(text: str, what: str) -> list[dict[str, Any]]:
    """The JSON list of objects podman printed, or E034 quoting what it printed instead."""
    try:
        data = json.loads(text or "[]")
    except ValueError as exc:
        data = exc
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        shown = text.strip()[:200] or "(nothing)"
        raise MachineFailed(
            f"`{what}` did not print a JSON list of machines: {shown}",
            fix=f"run `{what}` by hand: provision reads podman >= 5.2's JSON (`provision doctor` checks the version)",
        )
    return data


def parse_list(text: str) -> list[MachineInfo]:
    out = []
    for row in _rows(text, "podman machine list --format json"):
        # Older podman marks the default machine with a trailing '*' in Name.
        name = str(row.get("Name", "")).rstrip("*")
        mem_bytes = _int(row.get("Memory"))
        out.append(
            MachineInfo(
                name=name,
                running=bool(row.get("Running")) or bool(row.get("Starting")),
                vm_type=row.get("VMType"),
                cpus=_int(row.get("CPUs")),
                memory_mib=None if mem_bytes is None else mem_bytes // (1024 * 1024),
                default=bool(row.get("Default")),
            )
        )
    return out


def parse_inspect(text: str) -> list[MachineInfo]:
    out = []
    for row in _rows(text, "podman machine inspect"):
        res = row.get("Resources") or {}
        if not isinstance(res, dict):
            res = {}
        out.append(
            MachineInfo(
                name=str(row.get("Name", "")),
                running=str(row.get("State", "")).lower() in ("running", "starting"),
                vm_type=row.get("VMType"),
                cpus=_int(res.get("CPUs")),
                memory_mib=_int(res.get("Memory")),
            )
        )
    return out


def find(machines: list[MachineInfo], name: str) -> MachineInfo | None:
    return next((m for m in machines if m.name == name), None)
