"""`provision launch` as data: the env and ordered podman commands that bring a podman
machine (libkrun provider, our krunkit) up on the Venus or the APIR route.

Pure: the caller supplies the bundle paths, what it saw of the machine and the route
recorded at its last start; nothing here runs a program or reads a file. The darwin host
backend executes the plan; ``--dry-run`` prints it (``shell()`` or ``as_dict()``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from provision.adapters import lsof, podman_machine
from provision.adapters.podman_machine import MachineInfo
from provision.core.catalog import GPU_ROUTES
from provision.core.errors import InvalidValue, MemoryLimit, UnknownRoute
from provision.hosts import LaunchRequest
from provision.hosts.darwin.bundle import GGML_METAL_REG, VIRGLRENDERER, KrunBundle

ROUTES = GPU_ROUTES

# Host-side variables only the APIR route sets. krunkit inherits podman's environment, so
# a Venus launch must drop them: VIRGL_ROUTE_VENUS_TO_APIR left over in a shell breaks Venus.
APIR_HOST_ENV = (
    "VIRGL_APIR_BACKEND_LIBRARY",
    "APIR_LLAMA_CPP_GGML_LIBRARY_PATH",
    "APIR_LLAMA_CPP_GGML_LIBRARY_REG",
    "VIRGL_APIR_LOG_TO_FILE",
    "APIR_LLAMA_CPP_LOG_TO_FILE",
    "VIRGL_ROUTE_VENUS_TO_APIR",
)

VENUS_DISABLED_WARNING = (
    "VIRGL_ROUTE_VENUS_TO_APIR=1 routes the Venus capset to APIR: Vulkan/Venus is disabled on machine "
    "{machine} until it is relaunched with --route venus (needed until libkrun routes the APIR capset)"
)


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "why": self.why}


@dataclass(frozen=True)
class LaunchPlan:
    route: str
    machine: str
    env: dict[str, str]
    unset: tuple[str, ...]
    steps: tuple[Step, ...]
    verify: Step
    expect_virglrenderer: str
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "machine": self.machine,
            "env": dict(self.env),
            "unset": list(self.unset),
            "steps": [s.as_dict() for s in self.steps],
            "verify": self.verify.as_dict(),
            "expect_virglrenderer": self.expect_virglrenderer,
            "warnings": list(self.warnings),
        }

    def shell(self) -> str:
        """Lines a shell can source: env changes as commands, the podman steps as comments."""
        lines = [_comment(f"provision launch plan: route {self.route}, machine {self.machine}")]
        lines += [_comment(f"warning: {w}") for w in self.warnings]
        if self.unset:
            lines.append("unset " + " ".join(self.unset))
        lines += [f"export {k}={shlex.quote(v)}" for k, v in self.env.items()]
        for i, step in enumerate(self.steps, 1):
            lines.append(_comment(f"step {i} ({step.why}): {shlex.join(step.argv)}"))
        lines.append(_comment(f"verify ({self.verify.why}): {shlex.join(self.verify.argv)}"))
        return "\n".join(lines) + "\n"

    def child_env(self, base: dict[str, str]) -> dict[str, str]:
        """The environment podman (and so krunkit) gets: base minus ``unset`` plus ``env``."""
        out = {k: v for k, v in base.items() if k not in self.unset}
        out.update(self.env)
        return out


def _comment(text: str) -> str:
    """One shell comment line: a line break in ``text`` must not end the comment and start a command."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def check_memory(compat: dict[str, Any], ram_mib: int | None, vram_mib: int | None) -> list[str]:
    """E031 for what krunkit cannot map; warnings for what it will silently shrink."""
    limits = compat["krunkit_memory"]
    max_ram, window, space = (
        int(limits["max_ram_mib"]),
        int(limits["vram_window_mib"]),
        int(limits["address_space_mib"]),
    )
    warnings: list[str] = []
    if ram_mib is None:
        return warnings
    if ram_mib <= 0:
        raise InvalidValue(f"--memory {ram_mib}: must be a positive number of MiB")
    if ram_mib > max_ram:
        raise MemoryLimit(
            f"RAM {ram_mib} MiB is over krunkit's cap of {max_ram} MiB ({limits['why']})",
            fix=f"use --memory {max_ram} or less",
        )
    if vram_mib is not None:
        if ram_mib + vram_mib > space:
            raise MemoryLimit(
                f"RAM {ram_mib} MiB + VRAM {vram_mib} MiB = {ram_mib + vram_mib} MiB is over the "
                f"{space} MiB (64 GiB) guest address space libkrun can map ({limits['why']})",
                fix=f"lower --memory to {space - vram_mib} MiB or less",
            )
        if window - ram_mib < vram_mib:
            warnings.append(
                f"krunkit gives the GPU a {window - ram_mib} MiB VRAM window ({window} - {ram_mib} MiB RAM), "
                f"less than the {vram_mib} MiB asked for; large models may fail to allocate"
            )
    return warnings


def route_env(request: LaunchRequest, bundle: KrunBundle) -> tuple[dict[str, str], tuple[str, ...], list[str]]:
    env = {
        "CONTAINERS_MACHINE_PROVIDER": "libkrun",
        "CONTAINERS_HELPER_BINARY_DIR": str(bundle.bin_dir),
    }
    warnings: list[str] = []
    if request.route == "venus":
        return env, APIR_HOST_ENV, warnings
    env["VIRGL_APIR_BACKEND_LIBRARY"] = str(bundle.ggml_backend)
    env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] = str(bundle.ggml_metal)
    env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] = GGML_METAL_REG
    unset: tuple[str, ...] = ()
    if request.apir_log_dir:
        env["VIRGL_APIR_LOG_TO_FILE"] = f"{request.apir_log_dir.rstrip('/')}/virgl-apir.log"
        env["APIR_LLAMA_CPP_LOG_TO_FILE"] = f"{request.apir_log_dir.rstrip('/')}/apir-ggml.log"
    else:
        unset = ("VIRGL_APIR_LOG_TO_FILE", "APIR_LLAMA_CPP_LOG_TO_FILE")
    env["VIRGL_ROUTE_VENUS_TO_APIR"] = "1"
    warnings.append(VENUS_DISABLED_WARNING.format(machine=request.machine))
    return env, unset, warnings


def plan_launch(
    request: LaunchRequest,
    bundle: KrunBundle,
    compat: dict[str, Any],
    *,
    machine: MachineInfo | None,
    recorded_route: str | None,
) -> LaunchPlan:
    if request.route not in ROUTES:
        raise UnknownRoute(f"route {request.route!r} is not one of {', '.join(ROUTES)}")

    ram = request.memory_mib if request.memory_mib is not None else (machine.memory_mib if machine else None)
    warnings = check_memory(compat, ram, request.vram_mib)
    env, unset, route_warnings = route_env(request, bundle)
    warnings += route_warnings
    name = request.machine
    steps: list[Step] = []
    if machine is None:
        steps.append(
            Step(
                tuple(podman_machine.init_cmd(name, cpus=request.cpus, memory_mib=request.memory_mib)),
                "machine absent: create it with the libkrun provider",
            )
        )
        steps.append(Step(tuple(podman_machine.start_cmd(name)), f"start krunkit with the {request.route} env"))
    else:
        resize = (request.cpus is not None and request.cpus != machine.cpus) or (
            request.memory_mib is not None and request.memory_mib != machine.memory_mib
        )
        other_route = recorded_route != request.route
        if machine.running and other_route:
            was = recorded_route or "an unknown route (not started by provision)"
            warnings.append(f"machine {name} is running with {was}; restarting it on the {request.route} route")
        if machine.running and (other_route or resize):
            steps.append(
                Step(
                    tuple(podman_machine.stop_cmd(name)),
                    "krunkit reads its env only at start" if other_route else "resizing needs a stopped machine",
                )
            )
        if resize:
            steps.append(
                Step(
                    tuple(podman_machine.set_cmd(name, cpus=request.cpus, memory_mib=request.memory_mib)),
                    "apply --cpus/--memory",
                )
            )
        if not machine.running or other_route or resize:
            steps.append(Step(tuple(podman_machine.start_cmd(name)), f"start krunkit with the {request.route} env"))
        else:
            warnings.append(f"machine {name} already runs on the {request.route} route; nothing to restart")
    verify = Step(tuple(lsof.command_cmd("krunkit")), "confirm krunkit mapped our virglrenderer")
    return LaunchPlan(
        route=request.route,
        machine=name,
        env=env,
        unset=unset,
        steps=tuple(steps),
        verify=verify,
        expect_virglrenderer=str(bundle.lib_dir / VIRGLRENDERER),
        warnings=tuple(warnings),
    )
