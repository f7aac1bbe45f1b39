"""Checks as data: what `provision doctor` and the preflights report.

Every check has a stable id, a status, the evidence it saw and the fix. Producers are
pure functions of probed facts, so tests feed them real artifacts and recorded outputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["ok", "warn", "fail", "skip"]


@dataclass(frozen=True)
class Check:
    id: str
    status: Status
    evidence: str
    fix: str | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def failed(checks: list[Check]) -> bool:
    return any(c.status == "fail" for c in checks)


@dataclass(frozen=True)
class DoctorContext:
    """What every host's check provider may look at; ``extras`` carries a host's own facts."""

    platform: str
    env: dict[str, str]
    home: Path
    compat: dict[str, Any]
    krun: Path | None = None
    machine: str | None = None  # None: podman's default machine
    vram_mib: int | None = None
    guest_image: str | None = None
    pinned_mesa: str = ""
    extras: dict[str, Any] = field(default_factory=dict)
