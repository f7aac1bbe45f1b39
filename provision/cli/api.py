"""`provision api [--listen HOST:PORT] [--max-vms N] [--token-file F]`: the HTTP execution API.

Thin: parse, build the settings, serve (provision/api). FastAPI and uvicorn are imported only
here, so other commands do not pay for them. docs/api.md describes the endpoints.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import command
from provision.core.errors import InvalidValue, ToolMissing, WrongPlatform

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
# What the pyproject's `api` extra brings (and what it pulls in): the modules a missing extra lacks.
API_EXTRA = ("fastapi", "uvicorn", "pydantic", "pydantic_core", "starlette", "anyio", "h11")

COMMANDS = {
    "api": "serve the HTTP execution API (POST /api/v1/execute) on this Linux host",
}


def register(sub: argparse._SubParsersAction) -> None:
    from provision.api import settings as api_settings

    p = command(
        sub,
        "api",
        COMMANDS["api"],
        "provision api --listen 127.0.0.1:8080 --max-vms 2",
        "curl -s -X POST http://127.0.0.1:8080/api/v1/execute -H 'content-type: application/json' "
            """-d '{"language": "llama-linux", "gpu": true, "code": "vulkaninfo --summary"}'""",
    )
    p.add_argument(
        "--listen",
        default=api_settings.DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to listen on (default {api_settings.DEFAULT_LISTEN}; port 0 = any free one); "
        "a non-loopback address needs --token-file",
    )
    p.add_argument("--max-vms", type=int, default=api_settings.DEFAULT_MAX_VMS, metavar="N", help="VMs at once")
    p.add_argument("--token-file", type=Path, default=None, metavar="F", help="bearer token, a file of mode 0600")
    p.add_argument(
        "--grace",
        type=float,
        default=api_settings.DEFAULT_GRACE_S,
        metavar="S",
        help="on SIGTERM, seconds running guests get to finish before they are stopped",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision import hosts
    from provision.api import settings as api_settings

    if hosts.native().name != "linux":
        raise WrongPlatform("provision api runs Linux guests (QEMU) and needs a Linux host")
    if args.max_vms < 1:
        raise InvalidValue(f"--max-vms {args.max_vms}: expected a positive integer", fix="--max-vms 2")
    if args.grace < 0:
        raise InvalidValue(f"--grace {args.grace}: expected seconds >= 0", fix="--grace 30")
    try:
        from provision.api import auth, server

        settings = api_settings.Settings(
            listen=api_settings.parse_listen(args.listen),
            max_vms=args.max_vms,
            token=auth.read_token_file(args.token_file) if args.token_file else None,
            grace_s=args.grace,
        )
        return server.serve(settings)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in API_EXTRA:
            raise  # not the optional dependencies: a bug, reported as one
        raise ToolMissing(
            f"provision api needs the `api` extra, which is not installed (no module named {exc.name!r})",
            fix="pip install 'krun-gpu[api]'",
        ) from None
