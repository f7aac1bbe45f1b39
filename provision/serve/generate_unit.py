"""`provision serve --generate systemd`: a Linux serve as a systemd service that runs `provision serve`.

On Linux serve boots a QEMU guest (virglrenderer's Venus on the host's GPU, a GPU slot, a NIC that
forwards one port), which no container image describes: the unit runs the very command, in the
foreground, with its model, port, name, limits and llama-server options. systemd stops it with
SIGTERM to that process alone (``KillMode=mixed``): serve then stops its guest as on Ctrl-C, and
only what is left after ``TimeoutStopSec`` is killed. ``Restart=on-failure`` starts it again,
except after a usage error (E003 and E007: a restart cannot mend them).

The unit carries the environment serve reads (``PROVISION_*``: the cache holding the model store,
the host tools and the GPU slots) and the Python and package that wrote it. Pure: the text only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from provision.core.catalog import Stack
from provision.core.errors import InvalidValue
from provision.serve import engine
from provision.serve.generate import plain

# serve's exit statuses for E003 (a value) and E007 (GPU rule): restarting repeats them.
NO_RESTART = (13, 17)
STOP_GRACE_S = 120  # serve stops its guest within seconds; state.stop waits 90 s before it kills
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_WORDS = re.compile(r"^[A-Za-z0-9_.,:/@+= -]+$")  # a --runtime-args value: plain words and spaces


@dataclass(frozen=True)
class Unit:
    stack: Stack
    model: str  # what `provision serve --model` is given: a store name, or an absolute GGUF path
    gpu: bool
    python: str  # the interpreter that runs `-m provision`
    package_root: str  # the directory holding the provision package it runs
    host: str = "127.0.0.1"
    port: int = 8080
    ctx: int | None = None
    parallel: int = 4
    name: str = ""
    wait_s: float = engine.DEFAULT_WAIT_S
    route: str | None = None
    options: engine.ServerOptions = engine.ServerOptions()
    env: Mapping[str, str] = field(default_factory=dict)


def check(u: Unit) -> Unit:
    from provision.core import catalog

    catalog.check_gpu(u.stack, u.gpu)
    if "linux" not in u.stack.hosts:
        raise InvalidValue(f"stack {u.stack.name} does not run on Linux",
                           fix="a stack that `provision stacks` lists for linux")  # fmt: skip
    if engine.check_host(u.host, allow_remote=False) != u.host:
        raise InvalidValue(f"--host {u.host}: a generated unit publishes on loopback only", fix="--host 127.0.0.1")
    engine.check_numbers(u.port, u.ctx, u.parallel)
    engine.check_options(u.options, u.gpu)
    if not _NAME.match(u.name):
        raise InvalidValue(f"--name {u.name!r}: a unit needs a lower-case name (a-z, 0-9, -; at most 63)",
                           fix="--name llama-linux-8080")  # fmt: skip
    if "/" in u.model and not Path(u.model).is_absolute():
        raise InvalidValue(f"--model {u.model}: a unit needs the GGUF's absolute path",
                           fix=f"--model {Path(u.model).resolve()}")  # fmt: skip
    for value, what in ((u.model, "--model"), (u.python, "the Python interpreter"), (u.package_root, "the package")):
        plain(value, what, "a path of plain characters (letters, digits, _ . , : / @ + = -)")
    for key, value in u.env.items():
        if not re.fullmatch(r"PROVISION_[A-Z0-9_]+", key):
            raise InvalidValue(f"{key}: not a provision setting a unit carries")
        plain(value, key, f"set {key} to a plain value, or unset it, before generating the unit")
    return u


def serve_argv(u: Unit) -> list[str]:
    """`provision serve` as the unit runs it: in the foreground, every choice spelled out."""
    argv = [u.python, "-m", "provision", "serve", u.stack.name, "--model", u.model, "--name", u.name, "--host", u.host,
            "--port", str(u.port), "--parallel", str(u.parallel), "--wait", f"{u.wait_s:g}"]  # fmt: skip
    argv += ["--gpu"] if u.gpu else []
    argv += ["--route", u.route] if u.route else []
    argv += ["--ctx-size", str(u.ctx)] if u.ctx is not None else []
    return argv + u.options.serve_argv()


def _exec_word(word: str) -> str:
    """One ExecStart word: plain as it is, or a --runtime-args value of plain words in double quotes."""
    if word.startswith("--runtime-args="):
        if not _WORDS.match(word):
            raise InvalidValue(f"{word!r} cannot go into a unit (allowed: plain words and spaces)",
                               fix="give --runtime-args plain values, or edit the unit by hand")  # fmt: skip
        return f'"{word}"' if " " in word else word
    return plain(word, "a serve argument", "plain values only")


def render(u: Unit) -> str:
    check(u)
    argv = serve_argv(u)
    env = {"PYTHONPATH": u.package_root, **dict(sorted(u.env.items()))}
    lines = [
        f"# {u.name}.service: written by `provision serve --generate systemd`. On Linux serve runs {u.stack.name}",
        "# in a QEMU guest, so this unit runs `provision serve` itself; stopping the unit stops the guest.",
        f"# Install: cp {u.name}.service ~/.config/systemd/user/ && systemctl --user daemon-reload && "
        f"systemctl --user start {u.name}",
        "#   (for root: /etc/systemd/system/ and systemctl without --user)",
        "[Unit]",
        f"Description=llama-server serving {Path(u.model).name} from the krun-gpu stack {u.stack.name} "
        f"(QEMU guest{', GPU' if u.gpu else ''}) on {u.host}:{u.port}",
        "",
        "[Service]",
        "Type=exec",
        *[f"Environment={k}={v}" for k, v in env.items()],
        "ExecStart=" + " ".join(_exec_word(w) for w in argv),
        "Restart=on-failure",
        "RestartSec=10",
        "RestartPreventExitStatus=" + " ".join(str(s) for s in NO_RESTART),
        "KillMode=mixed",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={STOP_GRACE_S}",
        "",
        "[Install]",
        "WantedBy=default.target",
    ]
    return "\n".join(lines) + "\n"
