"""Serving the app with uvicorn, and stopping it without leaving a guest behind.

On SIGTERM or SIGINT uvicorn stops accepting connections; we also start draining: jobs that
have no VM yet are cancelled at once, running guests get the grace period to finish and are
then stopped (their clients get E026). The lifespan's end waits until every job thread — and
so every QEMU — is gone.
"""

from __future__ import annotations

import socket
import sys
import threading
from types import FrameType

from provision.api.auth import require_token_policy
from provision.api.jobs import Runner
from provision.api.settings import Settings


def bind(settings: Settings) -> socket.socket:
    """The listening socket, bound before uvicorn starts so port 0 becomes a known port at once."""
    family = socket.AF_INET6 if ":" in settings.listen.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((settings.listen.host, settings.listen.port))
    except OSError as exc:
        sock.close()
        from provision.core.errors import InvalidValue

        raise InvalidValue(
            f"--listen {settings.listen.host}:{settings.listen.port}: {exc.strerror}",
            fix="pick a free port (or 0 for any) on an address of this host",
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(settings: Settings, runner: Runner | None = None) -> int:
    import uvicorn

    from provision.api.app import create_app

    require_token_policy(settings.listen, settings.token)
    jobs = runner or Runner(settings.max_vms, settings.max_capture_bytes)
    sock = bind(settings)
    host, port = sock.getsockname()[:2]
    url = settings.listen.__class__(host, port).url()
    config = uvicorn.Config(
        create_app(settings, jobs),
        http="h11",
        lifespan="on",
        log_level="info",
        server_header=False,
        # A backstop only: the drain below ends the jobs within the grace period.
        timeout_graceful_shutdown=int(settings.grace_s) + 30,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # A signal handler may interrupt code that holds the runner's lock: drain from a thread.
            threading.Thread(target=jobs.drain, args=(settings.grace_s,), name="drain", daemon=True).start()
            super().handle_exit(sig, frame)

    auth = "bearer token required" if settings.token else "no token (loopback only)"
    print(f"provision api: listening on {url} ({auth}, max {settings.max_vms} VMs)", file=sys.stderr, flush=True)
    Server(config).run(sockets=[sock])
    return 0
