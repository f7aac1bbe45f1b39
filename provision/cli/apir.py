"""`provision apir check|protocol`: the APIR host preflight, no VM needed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from provision.cli.output import command, table
from provision.core import values
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.adapters.apir import ProbeResult


# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "apir": "APIR (API remoting) host checks",
}


def register(sub: argparse._SubParsersAction) -> None:
    from provision.adapters.apir import ENV_BACKEND, ENV_GGML_PATH, ENV_GGML_REG

    p = command(sub, "apir", COMMANDS["apir"], "provision apir check --json", "provision apir protocol")
    actions = p.add_subparsers(dest="apir_command", metavar="ACTION", required=True)
    c = command(
        actions,
        "check",
        "load the host backend like virglrenderer does and query its device",
        "provision apir check --json",
        json=True,
    )
    c.add_argument("--backend", help=f"libggml-virtgpu-backend.so (default: ${ENV_BACKEND})")
    c.add_argument("--ggml-library", help=f"ggml backend library to serve (default: ${ENV_GGML_PATH})")
    c.add_argument("--reg", help=f"its registration symbol (default: ${ENV_GGML_REG})")
    c.add_argument("--alloc-mib", type=int, default=0,
                   help="also allocate, clear and free a buffer of this many MiB on the device")
    c.set_defaults(func=run_check)
    v = command(actions, "protocol", "APIR protocol of the pinned guest and host trees", "provision apir protocol",
                json=True)
    v.set_defaults(func=run_protocol)


def _mib(value: Any) -> str:
    return "-" if value is None else f"{int(value) / (1 << 20):.0f} MiB"


def report_rows(result: ProbeResult) -> list[tuple[str, Any]]:
    from provision.adapters.apir import DEFAULT_REG

    rows: list[tuple[str, Any]] = [
        ("backend", result.request.get("backend")),
        ("ggml library", result.request.get("ggml_library")),
        ("registration", result.request.get("ggml_reg") or f"(unset: the library uses {DEFAULT_REG})"),
        ("stage reached", result.stage),
        ("initialize", f"{result.code} ({result.code_name})" if result.code is not None else result.loader_error),
    ]
    dev = result.device
    if dev:
        rows += [("device", f"{dev['name']} ({dev['type']}, {dev['count']} device(s))"),
                 ("description", dev["description"]),
                 ("memory", f"{_mib(dev['memory_free'])} free of {_mib(dev['memory_total'])}"),
                 ("buffer type", f"{dev['buffer_type']} (alignment {dev['buffer_alignment']})")]
    buf = result.buffer
    if buf:
        rows += [("buffer", f"{_mib(buf['size'])}: alloc {buf.get('alloc_ms')} ms, clear {buf.get('clear_ms')} ms, "
                            f"free {buf.get('free_ms')} ms"),
                 ("free memory", f"before {_mib(buf.get('free_before'))}, after alloc "
                                 f"{_mib(buf.get('free_after_alloc'))}, after free {_mib(buf.get('free_after_free'))}")]
    rows += [(f"time {k}", f"{v} ms") for k, v in result.timings_ms.items()]
    rows.append(("probe wall time", f"{result.wall_ms:.0f} ms"))
    return rows


def run_check(args: argparse.Namespace) -> Result:
    from provision.apir import preflight as apir

    values.int_range(args.alloc_mib, "--alloc-mib", 0, 1 << 20, why="MiB; 0 allocates nothing")
    settings = apir.ApirSettings.resolve(backend=args.backend, ggml_library=args.ggml_library, ggml_reg=args.reg)
    result = apir.probe(settings, alloc_bytes=args.alloc_mib << 20)
    error = apir.failure(result, settings)
    lines = [table(["CHECK", "VALUE"], report_rows(result)), *(f"  ggml log {line}" for line in result.logs)]
    if error is None:
        lines.append("APIR host backend: OK")
    return Result({"settings": settings.__dict__, "result": result.as_dict()}, "\n".join(lines), error=error)


def run_protocol(args: argparse.Namespace) -> Result:
    from provision.apir import preflight as apir

    guest, host = apir.guest_protocol(), apir.host_protocol()
    check = apir.protocol_check(guest, host)
    data = {"guest": apir.format_protocol(guest), "host": apir.format_protocol(host),
            "label": {apir.LABEL_PROTOCOL: apir.format_protocol(guest)}, "check": check.as_dict()}  # fmt: skip
    return Result(data, table(["FIELD", "VALUE"], [("guest (llama.cpp pin)", apir.format_protocol(guest)),
                                      ("host (virglrenderer-apir pin)", apir.format_protocol(host)),
                                      ("image label", f"{apir.LABEL_PROTOCOL}={apir.format_protocol(guest)}"),
                                      ("check", f"{check.status}: {check.evidence}")]))
