"""`provision serve`: llama-server in a guest, published on a host address, until stopped.

Order, each step with its own error: catalog rules (E007) -> name, address and port checks
(E003, E027: before anything boots) -> the guest (its job is llama-server; on Linux a
guest run in a worker thread (hosts/linux/run/serve.py), with a NIC that forwards only the port) -> ``/health``
answers (E021 past the deadline, E024 with the logs when the guest dies) -> the URL is
announced -> the server runs until Ctrl-C, SIGTERM or `provision stop`, which stop the guest
the way Ctrl-C stops `provision run`.

Serving beyond loopback needs ``--allow-remote``: llama-server has no authentication here.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import math
import os
import re
import shlex
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from provision.core.catalog import Stack
from provision.core.errors import InvalidValue, PortInUse, ProvisionError, RunTimeout
from provision.serve import state as serve_state

GUEST_PORT = 8080
DEFAULT_WAIT_S = 900.0
# The guest's llama-server is started by this constant script; every value follows it as its own
# argument ("$@"), so no value is ever parsed by a shell. $MODEL is set by the job (the model's mount).
LAUNCH = 'exec llama-server -m "$MODEL" "$@"'
# Options serve sets itself (its own flags say how to change them): --runtime-args may not repeat them.
OWNED = {
    "-m": "--model", "--model": "--model", "-mu": "--model", "--model-url": "--model", "-hf": "--model",
    "-hfr": "--model", "--hf-repo": "--model", "-hff": "--model", "--hf-file": "--model",
    "-a": "--name", "--alias": "--name", "--host": "--host", "--port": "--port",
    "-dev": "--gpu", "--device": "--gpu", "-ngl": "--ngl", "--gpu-layers": "--ngl", "--n-gpu-layers": "--ngl",
    "-c": "--ctx-size", "--ctx-size": "--ctx-size", "-np": "--parallel", "--parallel": "--parallel",
    "-t": "--threads", "--threads": "--threads", "--temp": "--temp", "--embedding": "--embeddings",
    "--embeddings": "--embeddings", "--path": "(none: the web UI is not built)",
}  # fmt: skip


@dataclass(frozen=True)
class ServerOptions:
    """llama-server options beyond the model and the address, in the order they are passed: the model's
    own (an ollama model's template and params, serve/model_defaults.py), then the user's flags, then
    --runtime-args (llama-server keeps the last value of an option given twice)."""

    temp: float | None = None
    ngl: int | None = None  # layers on the GPU; None: all of them with --gpu
    threads: int | None = None
    embeddings: bool = False
    runtime_args: tuple[str, ...] = ()
    chat_template: str | None = None  # a jinja chat template (the GGUF's own when None)
    model_args: tuple[str, ...] = ()  # the model's sampling defaults, as llama-server options
    model_stop: tuple[str, ...] = ()  # the model's stop strings: no server option, kept for its clients (ps entry)

    def argv(self) -> list[str]:
        args: list[str] = []
        if self.chat_template is not None:
            args += ["--jinja", "--chat-template", self.chat_template]
        # The user's own flags come after the model's defaults: llama-server keeps the last value.
        args += list(self.model_args)
        if self.temp is not None:
            args += ["--temp", repr(self.temp)]
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.embeddings:
            args += ["--embeddings"]
        return args + list(self.runtime_args)

    def serve_argv(self) -> list[str]:
        """The user's flags again, as `provision serve` takes them (a supervisor's or a unit's command)."""
        argv: list[str] = []
        for flag, value in (("--temp", self.temp), ("--ngl", self.ngl), ("--threads", self.threads)):
            argv += [flag, str(value)] if value is not None else []
        argv += ["--embeddings"] if self.embeddings else []
        # One word with '=': argparse would take a value that starts with '-' for an option.
        return argv + ([f"--runtime-args={shlex.join(self.runtime_args)}"] if self.runtime_args else [])


def split_runtime_args(text: str | None) -> tuple[str, ...]:
    """``--runtime-args "…"``: words split as a shell would quote them (never run by one), each checked."""
    if not text:
        return ()
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InvalidValue(f"--runtime-args {text!r}: {exc}", fix="--runtime-args '--top-k 40 --min-p 0.05'") from None
    for word in words:
        if any(ord(c) < 32 or ord(c) == 127 for c in word):
            raise InvalidValue(f"--runtime-args: {word!r} holds a control character",
                               fix="give each llama-server option as plain text")  # fmt: skip
        flag = word.split("=", 1)[0]
        if flag in OWNED:
            raise InvalidValue(f"--runtime-args: {flag} is set by provision serve itself",
                               fix=f"use provision serve {OWNED[flag]} instead")  # fmt: skip
    return tuple(words)


def check_options(opts: ServerOptions, gpu: bool) -> ServerOptions:
    """E003 for a value llama-server would take badly or serve cannot honour, before anything boots."""
    if opts.temp is not None and not (math.isfinite(opts.temp) and 0.0 <= opts.temp <= 5.0):
        raise InvalidValue(f"--temp {opts.temp}: expected 0-5", fix="--temp 0.7")
    if opts.ngl is not None:
        if not gpu:
            raise InvalidValue(f"--ngl {opts.ngl}: layers go to a GPU only with --gpu", fix="add --gpu, or drop --ngl")
        if not 1 <= opts.ngl <= 999:
            raise InvalidValue(f"--ngl {opts.ngl}: expected 1-999 layers (drop --gpu for none)", fix="--ngl 20")
    if opts.threads is not None and not 1 <= opts.threads <= 1024:
        raise InvalidValue(f"--threads {opts.threads}: expected 1-1024", fix="--threads 4")
    return opts


@dataclass(frozen=True)
class ServeRequest:
    stack: Stack
    model_path: Path
    model: str  # the name clients use (`/v1/models`), and the file name in the guest
    gpu: bool
    host: str = "127.0.0.1"
    port: int = 8080
    ctx: int | None = None
    parallel: int = 4
    name: str = ""
    wait_s: float = DEFAULT_WAIT_S
    route: str | None = None
    options: ServerOptions = ServerOptions()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return server_command(self.stack, self.gpu, self.model, self.ctx, self.parallel, self.options)


def check_host(host: str, allow_remote: bool) -> str:
    """A numeric IPv4 address; beyond loopback only with ``allow_remote``."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidValue(f"--host {host!r}: not a numeric IP address", fix="--host 127.0.0.1") from None
    if addr.version != 4:
        raise InvalidValue(f"--host {host}: only IPv4 addresses can be published", fix="--host 127.0.0.1")
    if not addr.is_loopback and not allow_remote:
        raise InvalidValue(
            f"--host {host} would publish llama-server beyond this machine, and it has no authentication",
            fix="keep --host 127.0.0.1 (the default), or add --allow-remote to accept that risk",
        )
    return str(addr)


def check_numbers(port: int, ctx: int | None, parallel: int) -> None:
    if not 0 < port < 65536:
        raise InvalidValue(f"--port {port}: expected 1-65535", fix="--port 8080")
    if ctx is not None and not 0 < ctx <= 1 << 20:
        raise InvalidValue(f"--ctx {ctx}: expected a positive token count", fix="--ctx 4096")
    if not 0 < parallel <= 64:
        raise InvalidValue(f"--parallel {parallel}: expected 1-64", fix="--parallel 4")


def check_port_free(host: str, port: int) -> None:
    """E027 naming the port when a serve of ours holds it (a guest still booting listens on nothing
    yet) or something else listens there (tried the way a server binds)."""
    for entry in serve_state.entries():
        if entry.port == port and (entry.host == host or "0.0.0.0" in (entry.host, host)):
            raise PortInUse(
                f"port {port} is taken: the serve {entry.name!r} publishes on {entry.host}:{port} ({entry.status})",
                fix=f"choose another port (--port {port + 1}), or stop it first (provision stop {entry.name})",
            )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"cannot publish on {host}:{port}: port {port} is in use ({exc.strerror})",
                fix=f"choose another port (--port {port + 1}), or stop what listens on port {port} "
                f"(`ss -ltnp 'sport = :{port}'`)",
            ) from None


def server_command(
    stack: Stack, gpu: bool, model: str, ctx: int | None, parallel: int, options: ServerOptions | None = None
) -> list[str]:
    """The guest command: llama-server on the stack's device (all layers, or ``--ngl``) or none (CPU).

    ``sh -c LAUNCH llama-server ARG…``: the script is constant and each option is one argument.
    """
    opts = options or ServerOptions()
    args = ["--alias", model, "--host", "0.0.0.0", "--port", str(GUEST_PORT)]
    args += ["--parallel", str(parallel)]
    if ctx is not None:
        args += ["--ctx-size", str(ctx)]
    if gpu:
        args += ["--n-gpu-layers", str(opts.ngl if opts.ngl is not None else 99)]
        if stack.device:
            args += ["--device", stack.device]
    else:
        args += ["--n-gpu-layers", "0", "--device", "none"]
    return ["sh", "-c", LAUNCH, "llama-server", *args, *opts.argv()]


def health(host: str, port: int, timeout: float = 5.0) -> bool:
    """True once llama-server answers /health with 200 (503 while it loads the model)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False  # the forward accepts before the guest listens, then drops the connection
    finally:
        conn.close()


# --- the guest ---------------------------------------------------------------------------------


class Guest(Protocol):
    """One guest running the server's command; ``stop`` must leave nothing running."""

    def start(self) -> None: ...

    def running(self) -> bool: ...

    def booted_at(self) -> float | None: ...

    def stop(self) -> None: ...

    def failure(self) -> ProvisionError: ...

    def details(self) -> dict[str, object]: ...


# --- serving -------------------------------------------------------------------------------------


def wait_healthy(req: ServeRequest, guest: Guest, poll_s: float = 1.0) -> None:
    """Until /health answers; the deadline counts from the guest's boot (builds come first)."""
    while True:
        if not guest.running():
            raise guest.failure()
        booted = guest.booted_at()
        if booted is not None:
            if health("127.0.0.1" if req.host == "0.0.0.0" else req.host, req.port):
                return
            if time.monotonic() - booted > req.wait_s:
                raise RunTimeout(
                    f"llama-server did not answer {req.url}/health within {req.wait_s:.0f} s of the guest's start",
                    fix="raise --wait; the server log above shows where it stopped",
                )
        time.sleep(poll_s)


def serve(
    req: ServeRequest,
    guest: Guest,
    *,
    log: str | None = None,
    on_ready: Callable[[serve_state.Entry], None],
) -> int:
    """Serve until stopped. Raises KeyboardInterrupt on Ctrl-C/SIGTERM after stopping the guest."""
    check_port_free(req.host, req.port)
    entry = serve_state.claim(
        serve_state.own_entry(
            name=req.name,
            stack=req.stack.name,
            model=req.model,
            gpu=req.gpu,
            host=req.host,
            port=req.port,
            log=log,
            stop=list(req.options.model_stop),
        )
    )
    # SIGTERM (`provision stop`) and SIGHUP arrive as KeyboardInterrupt (adapters/signals.py, set by
    # the CLI's main), so every way out passes the guest's stop below.
    try:
        guest.start()
        try:
            wait_healthy(req, guest)
            extra = guest.details()
            entry = serve_state.update(
                entry,
                status="healthy",
                qemu_pid=extra.get("qemu_pid"),
                run_dir=extra.get("run_dir"),
            )
            on_ready(entry)
            while guest.running():
                time.sleep(0.5)
            raise guest.failure()
        finally:
            # A second Ctrl-C must not cut the cleanup short.
            with _ignoring_interrupts():
                guest.stop()
    finally:
        serve_state.release(entry)


@contextlib.contextmanager
def _ignoring_interrupts() -> Iterator[None]:
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def default_name(stack: Stack, port: int) -> str:
    return serve_state.check_name(f"{stack.name}-{port}")


_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<k>\d{5})-of-(?P<n>\d{5})\.gguf$")


def split_parts(path: Path) -> list[Path]:
    """Every file of the model: for part 1 of a split GGUF its siblings too (llama.cpp opens part 1 and
    finds part K by its name beside it), else the file alone."""
    m = _SPLIT.match(path.name)
    if m is None or m.group("k") != "00001":
        return [path]
    stem, count = m.group("stem"), int(m.group("n"))
    return [path.with_name(f"{stem}-{k:05d}-of-{count:05d}.gguf") for k in range(1, count + 1)]


def check_parts(path: Path) -> list[Path]:
    """E003 before anything boots when part 1 of a split model is given without all its siblings."""
    parts = split_parts(path)
    for part in parts[1:]:
        if not part.is_file():
            raise InvalidValue(f"{path.name} is part 1 of a split model, but {part} is missing",
                               fix="provision model verify NAME (or pull it again)")  # fmt: skip
    return parts


def guest_files(req: ServeRequest) -> tuple[str, dict[str, Path]]:
    """The model's file name in the guest and the files beside it: a split model keeps its part names."""
    parts = split_parts(req.model_path)
    if len(parts) == 1:
        return f"{req.model}.gguf", {}
    return parts[0].name, {p.name: p for p in parts[1:]}


def model_alias(ref: str, path: Path) -> str:
    """What clients call the model: the store name, or a GGUF file's stem."""
    candidate = Path(ref).name if os.sep in ref or ref.endswith(".gguf") else ref
    alias = candidate.removesuffix(".gguf").replace(":", "-") or path.stem  # NAME:TAG as the store spells it
    if not serve_state.NAME_RE.fullmatch(alias.lower()):
        alias = "model"
    return alias
