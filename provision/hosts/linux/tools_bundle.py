"""`provision host-tools --bundle/--from`: pack the host tools (and a guest disk) for a host without sid,
or install such a bundle; what the command prints comes back as data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provision.core import catalog
from provision.core.diagnostics import Check
from provision.hosts.linux import bundle, bundle_archive, disks
from provision.hosts.linux import tools as host_tools
from provision.hosts.linux.backend import image_for


def install(archive: Path, to: Path | None) -> tuple[dict[str, Any], list[Check]]:
    """Unpack a bundle (into the cache, or ``to``) and check the tools in it."""
    dest = bundle_archive.install(archive, to)
    checks = host_tools.checks(host_tools.HostTools(dest, "bundle", bundle=True))
    return {"installed": str(dest), "checks": [c.as_dict() for c in checks]}, checks


def make(out: Path, stack_name: str, with_guest: bool) -> dict[str, Any]:
    """Pack the cached chroot's tools, with the guest disk of ``stack_name`` unless ``with_guest`` is False."""
    chroot = host_tools.make()
    guest = None
    if with_guest:
        stack = catalog.load().get(stack_name)
        ref, image_id = image_for(stack)
        disk = disks.root_disk(ref, image_id)
        guest = bundle.Guest(stack.name, ref, image_id, disk.kernel, disk.initrd, disk.disk)
    manifest = bundle.make(chroot.root, out, guest)
    return {"bundle": str(out), "bytes": out.stat().st_size, "files": len(manifest["files"])}  # type: ignore[arg-type]
