"""APIR host preflight: answer, before any VM starts, whether the hypervisor's APIR settings work.

The probe itself lives in adapters/apir.py (ctypes, one fresh subprocess per probe). This module
decides what a probe result means: pass/fail, and for every failure the env var or config key
to fix. Interpretation is pure, so tests feed it real probe results.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

from provision.adapters import apir as probe_adapter
from provision.adapters.apir import (
    DEFAULT_REG,
    ENV_BACKEND,
    ENV_GGML_PATH,
    ENV_GGML_REG,
    INIT_BASE_INDEX,
    KEY_GGML_PATH,
    KEY_GGML_REG,
    ProbeRequest,
    ProbeResult,
)
from provision.core import pins
from provision.core.diagnostics import Check
from provision.core.errors import ApirCheckFailed

LABEL_PROTOCOL = "krun-gpu.apir.protocol"


class _HasEnv(Protocol):
    @property
    def env(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class ApirSettings:
    """What the hypervisor would hand the backend, and where each value came from."""

    backend: str | None
    ggml_library: str | None
    ggml_reg: str | None
    sources: dict[str, str]

    @classmethod
    def resolve(cls, *, backend: str | None = None, ggml_library: str | None = None, ggml_reg: str | None = None,
                env: Mapping[str, str] | None = None) -> ApirSettings:
        env = os.environ if env is None else env
        sources: dict[str, str] = {}

        def pick(flag_value: str | None, flag: str, var: str) -> str | None:
            if flag_value is not None:
                sources[var] = flag
                return flag_value
            if env.get(var):
                sources[var] = f"${var}"
                return env[var]
            sources[var] = "unset"
            return None

        return cls(pick(backend, "--backend", ENV_BACKEND), pick(ggml_library, "--ggml-library", ENV_GGML_PATH),
                   pick(ggml_reg, "--reg", ENV_GGML_REG), sources)


def fix_for(result: ProbeResult, settings: ApirSettings) -> str:
    """The one actionable sentence for a failed probe, naming the env var / config key to change."""
    lib = f"{ENV_GGML_PATH} (config key {KEY_GGML_PATH})"
    reg = f"{ENV_GGML_REG} (config key {KEY_GGML_REG})"
    if result.stage in ("stat", "dlopen"):
        return (f"set {ENV_BACKEND} to the path of libggml-virtgpu-backend.so (a regular file); "
                "build one with `provision ggml build --variant host`")
    if result.stage == "dlsym":
        return (f"{ENV_BACKEND} points at a library without apir_backend_initialize/apir_backend_dispatcher: "
                "use libggml-virtgpu-backend.so from a GGML_VIRTGPU_BACKEND=ON/ONLY build")
    if result.stage in ("crash", "timeout"):
        return "the backend library crashed or hung while initializing; run with --json and read logs/stderr"
    name = result.code_name
    if name == "ENV_VAR_MISSING":
        return f"set {lib} to the ggml backend library to serve, e.g. libggml-cuda.so or libggml-vulkan.so"
    if name == "CANNOT_OPEN":
        return (f"{lib} = {settings.ggml_library!r} cannot be loaded: point it at an existing ggml backend library "
                "(an absolute path, or a soname on the hypervisor's LD_LIBRARY_PATH)")
    if name == "SYMBOL_MISSING":
        used = settings.ggml_reg or f"{DEFAULT_REG} (the default when unset)"
        return (f"set {reg} to the library's registration function (e.g. ggml_backend_cuda_reg, "
                f"ggml_backend_vk_reg, ggml_backend_cpu_reg); {used} is not exported by {settings.ggml_library}; "
                f"{DEFAULT_REG} exists only in GGML_BACKEND_DL builds")
    if name == "BACKEND_REG_FAILED":
        return f"{reg} = {settings.ggml_reg!r} returned no registry: use the backend's own *_reg function"
    if name == "NO_DEVICE":
        return ("the ggml backend sees no device: check the driver (nvidia-smi / vulkaninfo) and that "
                "CUDA_VISIBLE_DEVICES / GGML_VK_VISIBLE_DEVICES in the hypervisor's environment are not empty")
    if name == "ALREADY_INITED":
        return ("another virgl context of this hypervisor process loaded a different ggml library: every "
                f"context of one process shares one (patch 0020); give the hypervisor one {ENV_GGML_PATH} and "
                f"{ENV_GGML_REG}, and restart it to change them")
    if name == "BACKEND_INIT_FAILED":
        return "the backend found a device but could not initialize it: read the ggml log lines above"
    if result.stage == "dispatch":
        return "the backend initialized but a dispatcher command failed: read the ggml log lines above"
    return f"unexpected APIR result {result.code} ({name}); report it with --json output"


def probe(settings: ApirSettings, *, alloc_bytes: int = 0, env: Mapping[str, str] | None = None,
          timeout_s: float = 180.0) -> ProbeResult:
    """Probe the settings in a fresh subprocess; never raises for a failed probe."""
    req = ProbeRequest(backend=settings.backend or "", ggml_library=settings.ggml_library,
                       ggml_reg=settings.ggml_reg, alloc_bytes=alloc_bytes, env=dict(env or {}), timeout_s=timeout_s)
    if not settings.backend:
        return ProbeResult(asdict(req), "stat", False, loader_error=f"{ENV_BACKEND} is not set and no --backend given")
    return probe_adapter.probe(req)


def failure(result: ProbeResult, settings: ApirSettings) -> ApirCheckFailed | None:
    """E040 naming what to fix, or None when the probe proved the settings work."""
    if result.ok:
        return None
    return ApirCheckFailed(describe_failure(result), fix=fix_for(result, settings))


def run_check(settings: ApirSettings, *, alloc_bytes: int = 0, env: Mapping[str, str] | None = None,
              timeout_s: float = 180.0) -> ProbeResult:
    """Probe the settings; raise ApirCheckFailed (E040) naming what to fix when they do not work."""
    result = probe(settings, alloc_bytes=alloc_bytes, env=env, timeout_s=timeout_s)
    error = failure(result, settings)
    if error is not None:
        raise error
    return result


def describe_failure(result: ProbeResult) -> str:
    if result.stage in ("stat", "dlopen", "dlsym"):
        return f"APIR backend library ({ENV_BACKEND}): {result.loader_error}"
    if result.stage == "crash":
        return f"the probe process died (exit {result.exit_status}): {result.stderr_tail[-300:]}"
    if result.stage == "timeout":
        return "the probe process did not finish in time"
    errors = [line for line in result.logs if line.startswith(("[4]", "[3]"))]
    detail = f": {errors[-1]}" if errors else ""
    if result.stage == "dispatch" or (result.code is not None and result.code == INIT_BASE_INDEX):
        return f"apir_backend_initialize succeeded but a dispatcher command failed{detail}"
    return f"apir_backend_initialize returned {result.code} ({result.code_name}){detail}"


def apir_checks(settings: ApirSettings | None = None) -> list[Check]:
    """Doctor's APIR checks: the configured backend (when configured) and the protocol pins."""
    settings = settings or ApirSettings.resolve()
    out: list[Check] = []
    if not settings.backend:
        out.append(Check("apir.backend", "skip", f"{ENV_BACKEND} is not set: the APIR route is not configured",
                         f"set {ENV_BACKEND}, {ENV_GGML_PATH} and {ENV_GGML_REG} to use the APIR route"))
    else:
        try:
            result = run_check(settings)
            dev = result.device or {}
            out.append(Check("apir.backend", "ok",
                             f"{settings.backend} + {settings.ggml_library} ({settings.ggml_reg}): "
                             f"{dev.get('name')} / {dev.get('description')}, "
                             f"{int(dev.get('memory_free', 0)) >> 20} MiB free of "
                             f"{int(dev.get('memory_total', 0)) >> 20} MiB"))
        except ApirCheckFailed as exc:
            out.append(Check("apir.backend", "fail", exc.message, exc.fix))
    out.append(protocol_check())
    return out


def doctor_checks(ctx: _HasEnv) -> list[Check]:
    """`provision doctor` provider (registered for every platform): the hypervisor env of ctx."""
    return apir_checks(ApirSettings.resolve(env=ctx.env))


def guest_protocol(pin_set: pins.Pins | None = None) -> tuple[int, int]:
    """Protocol the guest frontend is built with (the image label krun-gpu.apir.protocol)."""
    proto = (pin_set or pins.default()).source("llama-cpp")["apir_protocol"]
    return int(proto["major"]), int(proto["minor"])


def host_protocol(pin_set: pins.Pins | None = None, *, source: str = "virglrenderer-apir") -> tuple[int, int]:
    """Protocol of the pinned virglrenderer APIR tree the host bundle uses."""
    proto = (pin_set or pins.default()).source(source)["apir_protocol"]
    return int(proto["major"]), int(proto["minor"])


def format_protocol(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def parse_protocol(text: str) -> tuple[int, int]:
    major, _, minor = text.strip().partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ValueError(f"APIR protocol {text!r} is not MAJOR.MINOR")
    return int(major), int(minor)


def protocol_check(guest: tuple[int, int] | None = None, host: tuple[int, int] | None = None) -> Check:
    """A different major is fatal; a different minor is what today's pins give and only warns
    (the guest logs "Host minor … and guest minor … differ" and carries on)."""
    guest = guest or guest_protocol()
    host = host or host_protocol()
    evidence = f"guest ggml-virtgpu APIR protocol {format_protocol(guest)}, host virglrenderer {format_protocol(host)}"
    if guest[0] != host[0]:
        return Check("apir.protocol", "fail", evidence,
                     "rebuild the guest image and the host bundle from pins with the same APIR major version")
    if guest[1] != host[1]:
        return Check("apir.protocol", "warn", evidence + " (minor versions differ; the guest only warns)",
                     "pin llama.cpp and virglrenderer trees with the same APIR minor version when one exists")
    return Check("apir.protocol", "ok", evidence)
