"""`provision doctor`: every check of this host's route, as data, and the settings in force.

The host's own checks come from ``hosts.native().doctor_checks`` (the one registry); the APIR
preflight applies everywhere. Each setting is listed with the value in force and where it came
from (provision/core/settings.py). Exit 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from provision import hosts
from provision.apir import preflight as apir
from provision.core import catalog, pins
from provision.core import settings as settings_mod
from provision.core.diagnostics import Check, DoctorContext, failed
from provision.doctor.route import route_checks


def default_vram_mib() -> int | None:
    """The largest VRAM a darwin GPU stack asks for: what a machine must be able to map."""
    sizes = [s.gpu_vram_mib for s in catalog.load().stacks.values() if s.gpu and "darwin" in s.hosts and s.gpu_vram_mib]
    return max(sizes) if sizes else None


def context(
    *,
    krun: Path | None = None,
    machine: str | None = None,
    guest_image: str | None = None,
    platform: str | None = None,
    env: dict[str, str] | None = None,
) -> DoctorContext:
    p = pins.default()
    kwargs: dict[str, Any] = {}
    if machine:
        kwargs["machine"] = machine
    return DoctorContext(
        platform=hosts.platform_key(platform),
        env=dict(os.environ) if env is None else env,
        home=Path.home(),
        compat=p.compat,
        krun=krun,
        vram_mib=default_vram_mib(),
        guest_image=guest_image,
        pinned_mesa=str(p.fedora.get("mesa_vulkan_drivers", "")),
        **kwargs,
    )


def run(ctx: DoctorContext) -> list[Check]:
    return [*hosts.get(ctx.platform).doctor_checks(ctx), *apir.doctor_checks(ctx), *route_checks(ctx)]


def report(ctx: DoctorContext, checks: list[Check], settings: settings_mod.Settings | None = None) -> dict[str, Any]:
    s = settings or settings_mod.current()
    return {
        "platform": ctx.platform,
        "ok": not failed(checks),
        "checks": [c.as_dict() for c in checks],
        "settings": s.rows(),
    }


def exit_status(checks: list[Check]) -> int:
    return 1 if failed(checks) else 0
