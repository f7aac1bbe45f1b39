"""`provision serve`: llama-server in a guest, published on a host address, until stopped.

Order, each step with its own error: catalog rules (E007) -> name, address and port checks
(E003, E027: before anything boots) -> the guest (its job is llama-server; on Linux a
guest run in a worker thread (hosts/linux/serve.py), with a NIC that forwards only the port) -> ``/health``
answers (E021 past the deadline, E024 with the logs when the guest dies) -> the URL is
announced -> the server runs until Ctrl-C, SIGTERM or `provision stop`, which stop the guest
the way Ctrl-C stops `provision run`.

Serving beyond loopback needs ``--allow-remote``: llama-server has no authentication here.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
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

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


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
    """E027 when something already listens on host:port (tried the way a server binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"cannot publish on {host}:{port}: {exc.strerror}",
                fix=f"choose another port (--port), or stop what listens there (`ss -ltnp 'sport = :{port}'`)",
            ) from None


def server_command(stack: Stack, gpu: bool, model: str, ctx: int | None, parallel: int) -> list[str]:
    """The guest command: llama-server on all layers of the stack's device (GPU) or none (CPU)."""
    args = ["llama-server", "-m", "MODEL_PATH", "--alias", model, "--host", "0.0.0.0", "--port", str(GUEST_PORT)]
    args += ["--parallel", str(parallel)]
    if ctx is not None:
        args += ["--ctx-size", str(ctx)]
    if gpu:
        args += ["--n-gpu-layers", "99"]
        if stack.device:
            args += ["--device", stack.device]
    else:
        args += ["--n-gpu-layers", "0", "--device", "none"]
    # $MODEL is set by the job script (the model disk's mount point).
    return ["sh", "-c", "exec " + shlex.join(args).replace("MODEL_PATH", '"$MODEL"')]


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


def model_alias(ref: str, path: Path) -> str:
    """What clients call the model: the store name, or a GGUF file's stem."""
    candidate = Path(ref).name if os.sep in ref or ref.endswith(".gguf") else ref
    alias = candidate.removesuffix(".gguf").replace(":", "-") or path.stem  # NAME:TAG as the store spells it
    if not serve_state.NAME_RE.fullmatch(alias.lower()):
        alias = "model"
    return alias
