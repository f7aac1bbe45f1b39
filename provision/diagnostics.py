"""Checks as data: what `provision doctor` and the preflights report.

Every check has a stable id, a status, the evidence it saw and the fix. Producers are
pure functions of probed facts, so tests feed them real artifacts and recorded outputs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

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
