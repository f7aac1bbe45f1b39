"""`provision doctor`'s row for the route: the same decision `run --gpu` without a stack makes."""

from __future__ import annotations

from provision import hosts
from provision.core import catalog
from provision.core.diagnostics import Check, DoctorContext
from provision.core.errors import ProvisionError
from provision.routes.choose import HostFacts, choose


def check_route(facts: HostFacts, stacks: dict[str, catalog.Stack]) -> Check:
    try:
        decision = choose(facts, stacks, gpu=True)
    except ProvisionError as exc:
        return Check("route.auto", "fail", f"{exc.code}: {exc.message}", exc.fix)
    if decision.cpu:
        return Check(
            "route.auto", "warn", decision.line(), "expected on a host without a GPU; numbers are CPU numbers"
        )
    return Check("route.auto", "ok", decision.line())


def route_checks(ctx: DoctorContext) -> list[Check]:
    return [check_route(hosts.get(ctx.platform).route_facts(), catalog.load().stacks)]
