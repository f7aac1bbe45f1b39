"""`provision host-tools --bundle/--from`: pack the host tools (and a guest disk) for a host without sid,
or install such a bundle; what the command prints comes back as data."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from provision.core import catalog
from provision.core.diagnostics import Check
from provision.hosts.linux import bundle, bundle_archive, disks
from provision.hosts.linux import tools as host_tools
from provision.hosts.linux.facts import image_for


def install(archive: Path, to: Path | None) -> tuple[dict[str, Any], list[Check]]:
    """Unpack a bundle (into the cache, or ``to``) and check the tools in it."""
    dest = bundle_archive.install(archive, to)
    checks = host_tools.checks(host_tools.HostTools(dest, "bundle", bundle=True))
    payload = {"installed": str(dest), "installed_bytes": bundle_archive.tree_bytes(dest),
               "checks": [c.as_dict() for c in checks]}  # fmt: skip
    return payload, checks


def make(
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
    chroot = host_tools.make()
    if apir:
        from provision.hosts.linux import apir_host

        apir_host.make(virgl_src)
    guests = []
    work = [out.with_name(f".{out.name}.{name}.minimal") for name in stack_names]
    try:
        for name, tree in zip(stack_names if with_guest else [], work, strict=False):
            stack = catalog.load().get(name)
            ref, image_id = image_for(stack)
            disk = disks.root_disk(ref, image_id)
            if minimal:
                from provision.hosts.linux import minimal as minimal_mod

                disk = minimal_mod.make(disk, tree, name)
            guests.append(bundle.Guest(stack.name, ref, image_id, disk.kernel, disk.initrd, disk.disk))
        manifest = bundle.make(chroot.root, out, guests, host_driver=host_driver, apir=apir)
    finally:
        for tree in work:  # the minimal disks' work trees (copied into the bundle)
            shutil.rmtree(tree, ignore_errors=True)
    return {"bundle": str(out), "bytes": out.stat().st_size, "files": len(manifest["files"])}  # type: ignore[arg-type]
