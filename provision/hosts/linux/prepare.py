"""`provision host-tools` on Linux: make, check, pack or install the tools that run guests.

The sid chroot with QEMU + virglrenderer (tools/host_tools.py), its APIR side (apir/host_side.py),
and the bundle that carries them, with guest disks, to a host without sid (tools/bundle.py); what
the command prints comes back as data.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provision.core import values
from provision.core.diagnostics import Check
from provision.core.errors import InvalidValue
from provision.hosts import Prepared, ToolsRequest


def prepare(req: ToolsRequest) -> Prepared:
    from provision.hosts.linux.apir import host_side
    from provision.hosts.linux.tools import host_tools

    if req.virgl_src is not None and not req.apir:
        raise InvalidValue("--virgl-src is only used with --apir", fix="add --apir, or drop --virgl-src")
    if req.virgl_src is not None and not req.virgl_src.is_file():  # a git archive (.tar.xz) is a file
        values.existing_dir(req.virgl_src, "--virgl-src")
    if req.bundle is not None or req.install_from is not None:
        return _bundle(req)
    if not req.check:
        if req.apir:
            host_side.make(req.virgl_src)  # makes the base chroot first when needed
        else:
            host_tools.make(force=req.force)
    checks = host_tools.checks()
    if req.apir or host_side.locate() is not None:
        checks += host_side.checks()
    tools = host_tools.locate()
    return Prepared({"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]},
                    checks=tuple(checks))  # fmt: skip


def _bundle(req: ToolsRequest) -> Prepared:
    if req.bundle is not None and req.install_from is not None:
        raise InvalidValue("--bundle makes a bundle and --from installs one: give one of them")
    checks: list[Check] = []
    if req.host_driver and req.bundle is None:
        raise InvalidValue("--host-driver is only used with --bundle", fix="add --bundle OUT.tar.xz, or drop it")
    if req.install_from is not None:
        payload, checks = install_bundle(req.install_from, req.install_to)
    else:
        if req.install_to is not None:
            raise InvalidValue("--to is only used with --from")
        assert req.bundle is not None
        payload = make_bundle(req.bundle, list(req.stacks), req.guest, minimal=req.minimal,
                              host_driver=req.host_driver, apir=req.apir, virgl_src=req.virgl_src)  # fmt: skip
    lines = tuple(f"{k}: {v}" for k, v in payload.items() if k != "checks")
    return Prepared(payload, lines, tuple(checks))


def install_bundle(archive: Path, to: Path | None) -> tuple[dict[str, Any], list[Check]]:
    """Unpack a bundle (into the cache, or ``to``) and check the tools in it."""
    from provision.hosts.linux.tools import bundle_archive, host_tools

    dest = bundle_archive.install(archive, to)
    checks = host_tools.checks(host_tools.HostTools(dest, "bundle", bundle=True))
    payload = {"installed": str(dest), "installed_bytes": bundle_archive.tree_bytes(dest),
               "checks": [c.as_dict() for c in checks]}  # fmt: skip
    return payload, checks


def make_bundle(
    out: Path,
    stack_names: Sequence[str],
    with_guest: bool,
    *,
    minimal: bool = False,
    host_driver: bool = False,
    apir: bool = False,
    virgl_src: Path | None = None,
) -> dict[str, Any]:
    """Pack the cached chroot's tools with the guest disks of ``stack_names`` (none unless ``with_guest``):
    ``minimal`` cuts each disk to what runs, ``host_driver`` leaves Mesa's software drivers out (the
    host brings its GPU's EGL and Vulkan), ``apir`` adds the APIR virglrenderer."""
    from provision.core import catalog
    from provision.hosts.linux.run.facts import image_for
    from provision.hosts.linux.tools import bundle, host_tools
    from provision.images import disks

    chroot = host_tools.make()
    if apir:
        from provision.hosts.linux.apir import host_side

        host_side.make(virgl_src)
    guests = []
    work = [out.with_name(f".{out.name}.{name}.minimal") for name in stack_names]
    try:
        for name, tree in zip(stack_names if with_guest else [], work, strict=False):
            stack = catalog.load().get(name)
            ref, image_id = image_for(stack)
            disk = disks.root_disk(ref, image_id)
            if minimal:
                from provision.hosts.linux.tools import minimal_disk

                disk = minimal_disk.make(disk, tree, name)
            guests.append(bundle.Guest(stack.name, ref, image_id, disk.kernel, disk.initrd, disk.disk))
        manifest = bundle.make(chroot.root, out, guests, host_driver=host_driver, apir=apir)
    finally:
        for tree in work:  # the minimal disks' work trees (copied into the bundle)
            shutil.rmtree(tree, ignore_errors=True)
    return {"bundle": str(out), "bytes": out.stat().st_size, "files": len(manifest["files"])}  # type: ignore[arg-type]
