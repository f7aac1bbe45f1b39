"""Doctor check: the isolation a macOS guest gets (the ``podman run`` flags of provision/hosts/darwin/runplan.py)."""

from __future__ import annotations

from provision.core.diagnostics import Check, DoctorContext
from provision.core.isolation import GuestLimits
from provision.hosts.darwin.runplan import isolation_args


def isolation_checks(ctx: DoctorContext) -> list[Check]:
    flags = " ".join(isolation_args(GuestLimits(), None))
    return [
        Check(
            "darwin.isolation",
            "ok",
            f"podman run {flags}; the model mounted :ro (label=disable only for that virtiofs mount)",
        )
    ]
