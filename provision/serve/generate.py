"""`provision serve --generate quadlet|kube`: the served model as a podman quadlet unit or a Pod YAML.

Pure: the text only (the CLI writes it whole to the file the user names, provision/core/outputs.py).
Both describe one container of the stack's image running the same llama-server command as
`provision serve` (engine.server_command: the stack's device with ``--gpu``, none without), with
the GPU's render nodes (/dev/dri) when ``--gpu``, the model bind-mounted read-only, and the port
published on a loopback address only (``--allow-remote`` is not offered here: a unit outlives the
terminal that would have shown the warning). The container is locked down like `provision run`'s
(no capabilities, no new privileges, read-only root with a tmpfs /tmp).

Every value that reaches the file is checked against a plain character set first (E003 naming
it): unit files expand ``%`` and ``$`` and split on quotes, YAML has its own quoting, and a path
with such characters is far rarer than a broken unit.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from provision.core import catalog
from provision.core.catalog import Stack
from provision.core.errors import InvalidValue
from provision.serve import engine

FORMATS = ("quadlet", "kube")
MODEL_DIR = "/models"
DEVICE = "/dev/dri"
TMPFS = "/tmp:rw,nosuid,nodev,mode=1777"
# Characters a generated value may hold: no whitespace, quotes, backslash, '%', '$', '#', ';' or controls.
_PLAIN = re.compile(r"^[A-Za-z0-9_.,:/@+=-]+$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # a Kubernetes DNS-1123 label (also a unit name)


def plain(value: str, what: str, fix: str) -> str:
    if not _PLAIN.match(value):
        raise InvalidValue(f"{what} {value!r} cannot go into a generated unit or YAML as it is "
                           "(allowed: letters, digits and _ . , : / @ + = -)", fix=fix)  # fmt: skip
    return value


@dataclass(frozen=True)
class Served:
    """What the generated file runs: `provision serve`'s request, plus the image to run it from."""

    stack: Stack
    image: str
    model_path: Path  # absolute path on the host running podman
    model: str  # the alias clients use; the file's name in the container is MODEL.gguf
    gpu: bool
    host: str = "127.0.0.1"
    port: int = 8080
    ctx: int | None = None
    parallel: int = 4
    name: str = ""

    @property
    def model_in_container(self) -> str:
        return f"{MODEL_DIR}/{self.model}.gguf"


def check(s: Served) -> Served:
    """E007/E003 before anything is written: the GPU rule, loopback, numbers, every value plain."""
    catalog.check_gpu(s.stack, s.gpu)  # no silent CPU fallback in a unit either
    addr = ipaddress.ip_address(engine.check_host(s.host, allow_remote=False))
    if not addr.is_loopback:  # check_host allows loopback only without allow_remote; keep it explicit
        raise InvalidValue(f"--host {s.host}: a generated unit publishes on loopback only", fix="--host 127.0.0.1")
    engine.check_numbers(s.port, s.ctx, s.parallel)
    if not _NAME.match(s.name):
        raise InvalidValue(f"--name {s.name!r}: a generated unit needs a lower-case name (a-z, 0-9, -; at most 63)",
                           fix="--name llama-linux-8080")  # fmt: skip
    if not s.model_path.is_absolute():
        raise InvalidValue(f"model path {s.model_path}: must be absolute (podman mounts host paths)")
    plain(str(s.model_path), "model path", "move or link the GGUF to a path of plain characters, e.g. ~/models/x.gguf")
    plain(s.model, "model name", "--model with a plain store name")
    plain(s.image, "image", "provision image build STACK, then use its localhost/krun-gpu/STACK:TAG")
    for key, value in s.stack.guest_env.items():
        plain(value, f"stacks.{s.stack.name}.guest_env.{key}", "set a plain value in provision/data/stacks.yaml")
    return s


def server_argv(s: Served) -> list[str]:
    """`provision serve`'s llama-server argv (engine.server_command), with the model's path written in."""
    script = engine.server_command(s.stack, s.gpu, s.model, s.ctx, s.parallel)[-1]
    words = shlex.split(script)
    if words[:1] != ["exec"] or "$MODEL" not in words:
        raise AssertionError(f"engine.server_command changed shape: {script!r}")
    argv = [s.model_in_container if w == "$MODEL" else w for w in words[1:]]
    for w in argv:
        plain(w, "llama-server argument", f"check stacks.{s.stack.name}.device in provision/data/stacks.yaml")
    return argv


def environment(s: Served) -> dict[str, str]:
    env = dict(s.stack.guest_env)
    env.setdefault("XDG_CACHE_HOME", "/tmp/.cache")  # Mesa's shader cache: the root is read-only
    env["MODEL"] = s.model_in_container
    return dict(sorted(env.items()))


def quadlet(s: Served) -> str:
    """A podman quadlet ``.container`` unit (podman >= 4.4 reads it from ~/.config/containers/systemd/)."""
    check(s)
    argv = server_argv(s)
    lines = [
        f"# {s.name}.container: written by `provision serve --generate quadlet` (stack {s.stack.name}).",
        f"# Install: copy to ~/.config/containers/systemd/, then systemctl --user daemon-reload && "
        f"systemctl --user start {s.name}",
        "[Unit]",
        f"Description=llama-server serving {s.model} from the krun-gpu stack {s.stack.name} "
        f"on {s.host}:{s.port}",
        "",
        "[Container]",
        f"ContainerName={s.name}",
        f"Image={s.image}",
        f"PublishPort={s.host}:{s.port}:{engine.GUEST_PORT}",
        f"Volume={s.model_path}:{s.model_in_container}:ro",
    ]
    if s.gpu:
        lines.append(f"AddDevice={DEVICE}")  # without it the container has no render node: no silent CPU run
    lines += [f"Environment={k}={v}" for k, v in environment(s).items()]
    lines += [
        "DropCapability=all",
        "NoNewPrivileges=true",
        "ReadOnly=true",
        # The model may live in the user's home or on a machine's virtiofs share, which SELinux cannot relabel.
        "SecurityLabelDisable=true",
        f"PodmanArgs=--tmpfs={TMPFS}",
        "Exec=" + " ".join(argv),
        "",
        "[Service]",
        "Restart=on-failure",
        f"TimeoutStartSec={int(engine.DEFAULT_WAIT_S)}",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"


def pod(s: Served) -> dict[str, object]:
    """A Kubernetes v1 Pod as `podman kube play` reads it."""
    check(s)
    mounts: list[dict[str, object]] = [{"name": "model", "mountPath": s.model_in_container, "readOnly": True},
                                       {"name": "tmp", "mountPath": "/tmp"}]  # fmt: skip
    volumes: list[dict[str, object]] = [
        {"name": "model", "hostPath": {"path": str(s.model_path), "type": "File"}},
        {"name": "tmp", "emptyDir": {"medium": "Memory"}},
    ]
    if s.gpu:
        # kube play takes no CharDevice volumes; the render nodes come in as their host directory.
        mounts.append({"name": "dri", "mountPath": DEVICE})
        volumes.append({"name": "dri", "hostPath": {"path": DEVICE, "type": "Directory"}})
    container = {
        "name": "llama-server",
        "image": s.image,
        "command": server_argv(s),
        "env": [{"name": k, "value": v} for k, v in environment(s).items()],
        "ports": [{"containerPort": engine.GUEST_PORT, "hostPort": s.port, "hostIP": s.host, "protocol": "TCP"}],
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": s.name,
            "labels": {"app.kubernetes.io/name": "llama-server", "app.kubernetes.io/managed-by": "provision"},
            "annotations": {"krun-gpu/stack": s.stack.name, "krun-gpu/model": s.model,
                            "krun-gpu/gpu": "true" if s.gpu else "false"},  # fmt: skip
        },
        "spec": {"restartPolicy": "OnFailure", "containers": [container], "volumes": volumes},
    }


def kube(s: Served) -> str:
    header = (f"# {s.name}.yaml: written by `provision serve --generate kube` (stack {s.stack.name}).\n"
              f"# Run: podman kube play {s.name}.yaml    Stop: podman kube down {s.name}.yaml\n")  # fmt: skip
    return header + yaml.safe_dump(pod(s), sort_keys=False, default_flow_style=False)


def render(fmt: str, s: Served) -> str:
    if fmt == "quadlet":
        return quadlet(s)
    if fmt == "kube":
        return kube(s)
    raise InvalidValue(f"--generate {fmt!r}: expected one of {', '.join(FORMATS)}", fix="--generate quadlet")


def default_image(stack: Stack) -> str:
    """The tag `provision image build STACK` gives the stack's image for the current pins (computed, not built)."""
    from provision.core import pins as pins_mod
    from provision.images import build as images

    return images.default_tag(images.render_stack(stack, pins_mod.default()))
