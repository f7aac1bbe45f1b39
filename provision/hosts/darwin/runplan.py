"""`provision run` on the podman machine as data: the ``podman run --rm`` argv.

Pure. The container is locked down by default (provision/core/isolation.py says why): no
network unless ``serve`` publishes one port on 127.0.0.1, no capabilities, no new
privileges, a read-only root with a tmpfs ``/tmp``, and pid, memory and CPU limits.
GPU rules are the catalog's (E007 before anything starts); the guest env is the
stack's plus the route's. ``GGML_REMOTING_USE_APIR_CAPSET`` is set only when the hypervisor
routes the APIR capset (pins.json compat ``libkrun_routes_apir_capset``; false today), since
otherwise the guest must use the Venus capset that the host reroutes to APIR.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.apir.route import APIR_CAPSET_ENV
from provision.core import catalog, values
from provision.core.catalog import Stack
from provision.core.errors import InvalidValue
from provision.core.isolation import GuestLimits

MODEL_DIR = "/models"
IMAGE_PREFIX = "localhost/krun-gpu"
# Route defaults for `provision run` on the podman machine when --memory/--cpus are not given.
DEFAULT_MEMORY_MIB = 8192
DEFAULT_CPUS = 4
# Mesa keeps its shader cache under XDG_CACHE_HOME; the root is read-only, /tmp is not.
CACHE_HOME = "/tmp/.cache"


def image_repo(stack: Stack) -> str:
    """The repository `provision image build` tags a stack's images under (tag = content hash)."""
    return f"{IMAGE_PREFIX}/{stack.name}"


def guest_env(stack: Stack, route: str, compat: dict[str, Any]) -> dict[str, str]:
    env = dict(stack.guest_env)
    if route == "apir" and compat.get("libkrun_routes_apir_capset") is True:
        env[APIR_CAPSET_ENV] = "1"
    return env


@dataclass(frozen=True)
class Publish:
    """A container port published on the Mac (podman's ``-p HOST:PORT:GUEST``); serve only.

    Without one a run needs no network; the isolation of runs keys on ``publish is None``.
    """

    host: str
    port: int
    guest_port: int

    def podman_args(self) -> list[str]:
        return ["-p", f"{self.host}:{self.port}:{self.guest_port}"]


@dataclass(frozen=True)
class RunPlan:
    argv: tuple[str, ...]
    route: str
    gpu: bool
    model_in_guest: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "route": self.route, "gpu": self.gpu, "model_in_guest": self.model_in_guest}


def isolation_args(limits: GuestLimits, publish: Publish | None) -> list[str]:
    """What the container may reach: nothing on the network unless serve publishes its one port."""
    if publish is not None:
        values.int_range(publish.port, "--port", 1, 65535)
        values.int_range(publish.guest_port, "guest port", 1, 65535)
    net = ["--network=none"] if publish is None else publish.podman_args()
    return [
        *net,
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777",
        f"--pids-limit={limits.pids}",
        f"--memory={limits.memory_mib or DEFAULT_MEMORY_MIB}m",
        f"--cpus={limits.cpus or DEFAULT_CPUS}",
    ]


def plan_run(
    stack: Stack,
    *,
    gpu: bool,
    route: str | None,
    model_path: Path | None,
    command: Sequence[str],
    compat: dict[str, Any],
    image: str,
    limits: GuestLimits | None = None,
    publish: Publish | None = None,
    interactive: bool = False,
    model_name: str | None = None,
    model_extras: Mapping[str, Path] | None = None,
) -> RunPlan:
    catalog.check_gpu(stack, gpu)
    chosen = catalog.check_route(stack, route)
    if not command:
        raise InvalidValue("provision run: no command after --")
    argv = ["podman", "run", "--rm"]
    if interactive:
        argv.append("-it")  # provision shell: the user's terminal is the container's
    argv += isolation_args(limits or GuestLimits(), publish)
    if gpu:
        # Without --device the container sees no render node: never a silent CPU run.
        argv += ["--device", "/dev/dri"]
    model_in_guest = None
    if model_path is not None:
        if not model_path.is_absolute():
            raise InvalidValue(f"model path {model_path}: must be absolute (podman mounts host paths)")
        model_in_guest = f"{MODEL_DIR}/{model_name or model_path.name}"
        # The model comes from the host's home, which the machine mounts over virtiofs: SELinux
        # cannot label files there (relabeling fails), so the container could not read it.
        argv += ["--security-opt=label=disable"]
        argv += ["-v", f"{model_path}:{model_in_guest}:ro"]
        for name, path in (model_extras or {}).items():  # a split model's other parts, beside part 1
            argv += ["-v", f"{path}:{MODEL_DIR}/{name}:ro"]
    env = guest_env(stack, chosen, compat) if gpu else dict(stack.guest_env)
    env.setdefault("XDG_CACHE_HOME", CACHE_HOME)
    if model_in_guest:
        env["PROVISION_MODEL"] = model_in_guest
        env["MODEL"] = model_in_guest  # the name Linux guests use (serve's command reads it)
    for key in sorted(env):
        argv += ["-e", f"{key}={env[key]}"]
    argv.append(image)
    argv += list(command)
    return RunPlan(tuple(argv), chosen, gpu, model_in_guest)
