"""`provision serve --generate quadlet|kube`: a Mac's serve as a podman quadlet unit or a Pod YAML.

On macOS `provision serve` runs the stack's image in the podman machine (krunkit, libkrun's GPU:
the machine has /dev/dri), so the unit and the Pod describe that container and run where serve
does. On Linux serve boots a QEMU guest instead, which no container describes: there the unit is a
systemd service that runs `provision serve` itself (generate_unit.py), and asking for a quadlet or
a Pod there is E003 naming the one that fits.

Pure: the text only (the CLI writes it whole to the file the user names, provision/core/outputs.py).
Both run llama-server as `provision serve` does (engine.server_command: the stack's device with
``--gpu``, none without, and its options), with the render nodes when ``--gpu``, the model
bind-mounted read-only (a split model part by part, each under its own name: llama.cpp finds part
K by name beside part 1), and the port published on a loopback address only (``--allow-remote``
is not offered here: a unit outlives the terminal that would have shown the warning). The
container is locked down like `provision run`'s (no capabilities, no new privileges, read-only
root with a tmpfs /tmp).

Every value that reaches the file is checked against a plain character set first (E003 naming
it): unit files expand ``%`` and ``$`` and split on quotes, YAML has its own quoting, and a path
with such characters is far rarer than a broken unit. The one exception is an ollama model's chat
template, which only the Pod carries (a YAML string); the quadlet leaves it to the GGUF and says so.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from provision.core import catalog
from provision.core.catalog import Stack
from provision.core.errors import InvalidValue
from provision.serve import engine

FORMATS = ("quadlet", "kube")  # for a Mac's podman machine; generate_unit.py: "systemd" for Linux
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
    options: engine.ServerOptions = engine.ServerOptions()

    @property
    def parts(self) -> list[Path]:
        """Every file of the model: part 1's siblings too, when it is part 1 of a split GGUF."""
        return engine.split_parts(self.model_path)

    def mounts(self) -> list[tuple[Path, str]]:
        """(host path, path in the container): a split model keeps its part names, one file keeps the alias."""
        parts = self.parts
        if len(parts) == 1:
            return [(self.model_path, f"{MODEL_DIR}/{self.model}.gguf")]
        return [(p, f"{MODEL_DIR}/{p.name}") for p in parts]

    @property
    def model_in_container(self) -> str:
        return self.mounts()[0][1]


def check(s: Served) -> Served:
    """E007/E003 before anything is written: the GPU rule, loopback, numbers, every value plain."""
    catalog.check_gpu(s.stack, s.gpu)  # no silent CPU fallback in a unit either
    if "darwin" not in s.stack.hosts:
        raise InvalidValue(f"stack {s.stack.name}: serve runs it in a QEMU guest, not in a container",
                           fix="--generate systemd for it, or a stack for macOS (provision stacks)")  # fmt: skip
    addr = ipaddress.ip_address(engine.check_host(s.host, allow_remote=False))
    if not addr.is_loopback:  # check_host allows loopback only without allow_remote; keep it explicit
        raise InvalidValue(f"--host {s.host}: a generated unit publishes on loopback only", fix="--host 127.0.0.1")
    engine.check_numbers(s.port, s.ctx, s.parallel)
    if not _NAME.match(s.name):
        raise InvalidValue(f"--name {s.name!r}: a generated unit needs a lower-case name (a-z, 0-9, -; at most 63)",
                           fix="--name llama-linux-8080")  # fmt: skip
    if not s.model_path.is_absolute():
        raise InvalidValue(f"model path {s.model_path}: must be absolute (podman mounts host paths)")
    if s.model_path.name.startswith(".") or s.model_path.name in ("", ".."):
        raise InvalidValue(f"model path {s.model_path}: not a GGUF file name")
    for part in engine.check_parts(s.model_path):
        plain(str(part), "model path", "move or link the GGUF to a path of plain characters, e.g. ~/models/x.gguf")
    plain(s.model, "model name", "--model with a plain store name")
    plain(s.image, "image", "provision image build STACK, then use its localhost/krun-gpu/STACK:TAG")
    for key, value in s.stack.guest_env.items():
        plain(value, f"stacks.{s.stack.name}.guest_env.{key}", "set a plain value in provision/data/stacks.yaml")
    return s


def server_argv(s: Served, *, template: bool = True) -> list[str]:
    """`provision serve`'s llama-server argv (engine.server_command), with the model's path written in;
    ``template=False`` leaves an ollama model's chat template out (a quadlet cannot carry it)."""
    opts = s.options if template else replace(s.options, chat_template=None)
    command = engine.server_command(s.stack, s.gpu, s.model, s.ctx, s.parallel, opts)
    if command[:4] != ["sh", "-c", engine.LAUNCH, "llama-server"]:
        raise AssertionError(f"engine.server_command changed shape: {command[:4]!r}")
    argv = ["llama-server", "-m", s.model_in_container, *command[4:]]
    skip = {argv.index("--chat-template") + 1} if opts.chat_template is not None else set()
    for i, w in enumerate(argv):
        if i not in skip:
            plain(w, "llama-server argument", "give --runtime-args and the other options plain values")
    return argv


def environment(s: Served) -> dict[str, str]:
    env = dict(s.stack.guest_env)
    env.setdefault("XDG_CACHE_HOME", "/tmp/.cache")  # Mesa's shader cache: the root is read-only
    env["MODEL"] = s.model_in_container
    return dict(sorted(env.items()))


def quadlet(s: Served) -> str:
    """A podman quadlet ``.container`` unit (podman >= 4.4 reads it from ~/.config/containers/systemd/)."""
    check(s)
    argv = server_argv(s, template=False)
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
    ]
    lines += [f"Volume={host}:{inside}:ro" for host, inside in s.mounts()]
    if s.options.chat_template is not None:
        lines.insert(2, "# The model's ollama template is not here (an Exec= line cannot carry it): llama-server uses "
                        "the GGUF's own; --generate kube carries it.")  # fmt: skip
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
    mounts: list[dict[str, object]] = []
    volumes: list[dict[str, object]] = []
    models = s.mounts()
    for i, (host, inside) in enumerate(models, start=1):
        vol = "model" if len(models) == 1 else f"model-part-{i}"
        mounts.append({"name": vol, "mountPath": inside, "readOnly": True})
        volumes.append({"name": vol, "hostPath": {"path": str(host), "type": "File"}})
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    volumes.append({"name": "tmp", "emptyDir": {"medium": "Memory"}})
    if s.gpu:
        # kube play takes no CharDevice volumes; the render nodes come in as their host directory
        # (the podman machine's: krunkit gives it virtio-gpu, so /dev/dri exists there).
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


def check_target(fmt: str, stack: Stack, target: str) -> None:
    """E003 unless ``fmt`` runs what serve runs on ``target`` ("darwin" or "linux") for ``stack``."""
    if target not in stack.hosts:
        raise InvalidValue(f"stack {stack.name} runs on {', '.join(stack.hosts)}, not on {target}",
                           fix=f"--target {stack.hosts[0]}, or a stack for {target} (provision stacks)")  # fmt: skip
    if target == "linux" and fmt != "systemd":
        raise InvalidValue(
            f"--generate {fmt}: on Linux `provision serve` runs {stack.name} in a QEMU guest, which a "
            f"{'quadlet container' if fmt == 'quadlet' else 'Pod'} cannot run",
            fix="--generate systemd (a unit that runs provision serve), or --target darwin for a Mac's podman machine",
        )
    if target == "darwin" and fmt == "systemd":
        raise InvalidValue("--generate systemd: on macOS `provision serve` runs a container in the podman machine",
                           fix="--generate quadlet or --generate kube")  # fmt: skip


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
