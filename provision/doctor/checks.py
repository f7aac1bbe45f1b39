"""`provision doctor`: every check of this host's route, as data.

``CHECK_PROVIDERS`` maps a platform to the functions that produce its checks; each takes a
``DoctorContext`` and returns ``list[Check]``. Other areas plug in with ``register``
(e.g. ``register("linux", linux_checks)`` from the Linux route, ``register("*", apir_checks)``
for checks that apply everywhere). Exit 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provision.apir import host as apir_host
from provision.apir import preflight as apir
from provision.core import catalog, pins
from provision.core.diagnostics import Check, DoctorContext, failed
from provision.hosts.darwin.doctor import darwin_checks
from provision.hosts.darwin.doctor_isolation import isolation_checks as darwin_isolation
from provision.hosts.darwin.traps import trap_checks as darwin_traps
from provision.hosts.linux.doctor import linux_checks
from provision.hosts.linux.doctor_isolation import isolation_checks as linux_isolation
from provision.routes.doctor import route_checks

Provider = Callable[[DoctorContext], list[Check]]

# "*" providers run on every platform, after the platform's own.
CHECK_PROVIDERS: dict[str, list[Provider]] = {
    "darwin": [darwin_checks, darwin_traps, darwin_isolation],
    "linux": [linux_checks, apir_host.doctor_checks, linux_isolation],
    "*": [apir.doctor_checks, route_checks],
}


def register(platform: str, provider: Provider) -> None:
    providers = CHECK_PROVIDERS.setdefault(platform, [])
    if provider not in providers:
        providers.append(provider)


def platform_key(platform: str) -> str:
    return "linux" if platform.startswith("linux") else platform


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
        platform=platform or sys.platform,
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
    key = platform_key(ctx.platform)
    providers = CHECK_PROVIDERS.get(key)
    if providers is None:
        return [Check("host.platform", "fail", f"no route for platform {ctx.platform!r}", "use macOS or Linux")]
    checks: list[Check] = []
    for provider in [*providers, *CHECK_PROVIDERS.get("*", [])]:
        checks += provider(ctx)
    return checks


def report(ctx: DoctorContext, checks: list[Check]) -> dict[str, Any]:
    return {
        "platform": platform_key(ctx.platform),
        "ok": not failed(checks),
        "checks": [c.as_dict() for c in checks],
    }


def exit_status(checks: list[Check]) -> int:
    return 1 if failed(checks) else 0
