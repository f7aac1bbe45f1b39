"""`provision host-tools` on Linux: make, check, pack or install the tools that run guests.

The sid chroot with QEMU + virglrenderer (tools.py), its APIR side (apir_host.py), and the
bundle that carries them to a host without sid (tools_bundle.py).
"""

from __future__ import annotations

from provision.core import values
from provision.core.diagnostics import Check
from provision.core.errors import InvalidValue
from provision.hosts import Prepared, ToolsRequest


def prepare(req: ToolsRequest) -> Prepared:
    from provision.hosts.linux import apir_host
    from provision.hosts.linux import tools as host_tools

    if req.virgl_src is not None and not req.apir:
        raise InvalidValue("--virgl-src is only used with --apir", fix="add --apir, or drop --virgl-src")
    if req.virgl_src is not None and not req.virgl_src.is_file():  # a git archive (.tar.xz) is a file
        values.existing_dir(req.virgl_src, "--virgl-src")
    if req.bundle is not None or req.install_from is not None:
        return _bundle(req)
    if not req.check:
        if req.apir:
            apir_host.make(req.virgl_src)  # makes the base chroot first when needed
        else:
            host_tools.make(force=req.force)
    checks = host_tools.checks()
    if req.apir or apir_host.locate() is not None:
        checks += apir_host.checks()
    tools = host_tools.locate()
    return Prepared({"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]},
                    checks=tuple(checks))  # fmt: skip


def _bundle(req: ToolsRequest) -> Prepared:
    from provision.hosts.linux import tools_bundle

    if req.bundle is not None and req.install_from is not None:
        raise InvalidValue("--bundle makes a bundle and --from installs one: give one of them")
    checks: list[Check] = []
    if req.host_driver and req.bundle is None:
        raise InvalidValue("--host-driver is only used with --bundle", fix="add --bundle OUT.tar.xz, or drop it")
    if req.install_from is not None:
        payload, checks = tools_bundle.install(req.install_from, req.install_to)
    else:
        if req.install_to is not None:
            raise InvalidValue("--to is only used with --from")
        assert req.bundle is not None
        payload = tools_bundle.make(req.bundle, list(req.stacks), req.guest, minimal=req.minimal,
                                    host_driver=req.host_driver, apir=req.apir, virgl_src=req.virgl_src)  # fmt: skip
    lines = tuple(f"{k}: {v}" for k, v in payload.items() if k != "checks")
    return Prepared(payload, lines, tuple(checks))
