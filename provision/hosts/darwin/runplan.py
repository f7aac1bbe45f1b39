"""`provision run` on the podman machine as data: the ``podman run --rm`` argv.

Pure. GPU rules are the catalog's (E007 before anything starts); the guest env is the
stack's plus the route's. ``GGML_REMOTING_USE_APIR_CAPSET`` is set only when the hypervisor
routes the APIR capset (pins.json compat ``libkrun_routes_apir_capset``; false today), since
otherwise the guest must use the Venus capset that the host reroutes to APIR.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.apir.route import APIR_CAPSET_ENV
from provision.core import catalog
from provision.core.catalog import Stack
from provision.core.errors import InvalidValue

MODEL_DIR = "/models"
IMAGE_PREFIX = "localhost/krun-gpu"


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


def plan_run(
    stack: Stack,
    *,
    gpu: bool,
    route: str | None,
    model_path: Path | None,
    command: Sequence[str],
    compat: dict[str, Any],
    image: str,
    publish: Publish | None = None,
    interactive: bool = False,
    model_name: str | None = None,
) -> RunPlan:
    catalog.check_gpu(stack, gpu)
    chosen = catalog.check_route(stack, route)
    if not command:
        raise InvalidValue("provision run: no command after --")
    argv = ["podman", "run", "--rm"]
    if interactive:
        argv.append("-it")  # provision shell: the user's terminal is the container's
    if publish is not None:
        argv += publish.podman_args()
    if gpu:
        # Without --device the container sees no render node: never a silent CPU run.
        argv += ["--device", "/dev/dri"]
    # The machine shares the host's home over virtiofs, where SELinux relabeling fails.
    argv += ["--security-opt", "label=disable"]
    model_in_guest = None
    if model_path is not None:
        if not model_path.is_absolute():
            raise InvalidValue(f"model path {model_path}: must be absolute (podman mounts host paths)")
        model_in_guest = f"{MODEL_DIR}/{model_name or model_path.name}"
        argv += ["-v", f"{model_path}:{model_in_guest}:ro"]
    env = guest_env(stack, chosen, compat) if gpu else dict(stack.guest_env)
    if model_in_guest:
        env["PROVISION_MODEL"] = model_in_guest
        env["MODEL"] = model_in_guest  # the name Linux guests use (serve's command reads it)
    for key in sorted(env):
        argv += ["-e", f"{key}={env[key]}"]
    argv.append(image)
    argv += list(command)
    return RunPlan(tuple(argv), chosen, gpu, model_in_guest)
