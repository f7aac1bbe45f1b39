"""`provision host-tools`: make (or show) the Debian sid chroot that runs QEMU for the Linux route."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import command, dumps, table
from provision.core import values
from provision.core.errors import InvalidValue

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "host-tools": "make the cached chroot with QEMU + virglrenderer (Linux route)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(
        sub,
        "host-tools",
        COMMANDS["host-tools"],
        "sudo provision host-tools",
        "sudo provision host-tools --apir --virgl-src ~/src/virglrenderer",
        "sudo provision host-tools --bundle krun-host-tools.tar.zst",
        "provision host-tools --from krun-host-tools.tar.zst",
        "sudo provision host-tools --bundle krun-host-tools.tar.xz   # installs where no zstd is",
        "sudo provision host-tools --bundle gpu-host.tar.xz --host-driver --no-guest   # a host with its GPU driver",
    )
    p.add_argument("--check", action="store_true", help="only report what is there (doctor-style), build nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when a cached chroot exists")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--apir",
        action="store_true",
        help="also build virglrenderer with APIR and the host ggml (Vulkan) in the chroot (route apir)",
    )
    p.add_argument(
        "--virgl-src",
        type=Path,
        help="with --apir: a local clone or mirror of the pinned APIR virglrenderer tree (checked against the pin)",
    )
    p.add_argument(
        "--bundle",
        type=Path,
        metavar="OUT.tar.zst",
        help="pack the tools (with their libraries, loader and libc) and a guest disk for a host without sid; "
        ".tar.xz or .tar.gz instead of .tar.zst need no zstd program to install",
    )
    p.add_argument(
        "--stack", action="append", default=None,
        help="with --bundle: a stack whose guest disk goes in (repeat for several; default llama-linux)",
    )
    p.add_argument(
        "--minimal", action="store_true",
        help="with --bundle: cut each guest disk to what runs (hosts/linux/minimal.py): no lavapipe, no LLVM, "
        "a small initrd",
    )
    p.add_argument("--no-guest", action="store_true", help="with --bundle: leave the guest disk out")
    p.add_argument(
        "--host-driver",
        action="store_true",
        help="with --bundle: the host brings its GPU's EGL and Vulkan drivers; leave Mesa's software drivers "
        "(llvmpipe, lavapipe, LLVM) out",
    )
    p.add_argument(
        "--from", dest="from_", type=Path, metavar="OUT.tar.zst",
        help="install a bundle made by --bundle (.tar.xz/.tar.gz with Python alone)",
    )
    p.add_argument("--to", type=Path, metavar="DIR", help="with --from: install there instead of the cache")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provision.apir import host as apir_host
    from provision.core.diagnostics import failed
    from provision.hosts.linux import tools as host_tools

    if args.virgl_src is not None and not args.apir:
        raise InvalidValue("--virgl-src is only used with --apir", fix="add --apir, or drop --virgl-src")
    values.existing_dir(args.virgl_src, "--virgl-src")
    if args.bundle is not None or args.from_ is not None:
        return _bundle(args)
    if not args.check:
        if args.apir:
            apir_host.make(args.virgl_src)  # makes the base chroot first when needed
        else:
            host_tools.make(force=args.force)
    checks = host_tools.checks()
    if args.apir or apir_host.locate() is not None:
        checks += apir_host.checks()
    if args.json:
        tools = host_tools.locate()
        print(dumps({"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]}))
    else:
        print(
            table(["CHECK", "STATUS", "EVIDENCE", "FIX"], [(c.id, c.status, c.evidence, c.fix or "") for c in checks])
        )
    return 1 if failed(checks) else 0


def _bundle(args: argparse.Namespace) -> int:
    from provision.core import catalog
    from provision.hosts.linux import bundle, bundle_archive, disks
    from provision.hosts.linux import tools as host_tools
    from provision.hosts.linux.backend import image_for

    if args.bundle is not None and args.from_ is not None:
        raise InvalidValue("--bundle makes a bundle and --from installs one: give one of them")
    if args.host_driver and args.bundle is None:
        raise InvalidValue("--host-driver is only used with --bundle", fix="add --bundle OUT.tar.xz, or drop it")
    if args.from_ is not None:
        dest = bundle_archive.install(args.from_, args.to)
        tools = host_tools.HostTools(dest, "bundle", bundle=True)
        checks = host_tools.checks(tools)
        payload: dict[str, object] = {
            "installed": str(dest),
            "installed_bytes": bundle_archive.tree_bytes(dest),
            "checks": [c.as_dict() for c in checks],
        }
    else:
        if args.to is not None:
            raise InvalidValue("--to is only used with --from")
        chroot = host_tools.make()
        if args.apir:
            from provision.apir import host as apir_host

            apir_host.make(args.virgl_src)
        guests = []
        for name in [] if args.no_guest else (args.stack or ["llama-linux"]):
            stack = catalog.load().get(name)
            ref, image_id = image_for(stack)
            disk = disks.root_disk(ref, image_id)
            if args.minimal:
                from provision.hosts.linux import minimal

                disk = minimal.make(disk, args.bundle.with_name(f".{args.bundle.name}.{name}.minimal"), name)
            guests.append(bundle.Guest(stack.name, ref, image_id, disk.kernel, disk.initrd, disk.disk))
        try:
            manifest = bundle.make(chroot.root, args.bundle, guests, host_driver=args.host_driver, apir=args.apir)
        finally:
            import shutil

            for name in args.stack or ["llama-linux"]:  # the minimal disks' work trees (copied into the bundle)
                shutil.rmtree(args.bundle.with_name(f".{args.bundle.name}.{name}.minimal"), ignore_errors=True)
        checks = []
        payload = {"bundle": str(args.bundle), "bytes": args.bundle.stat().st_size, "files": len(manifest["files"])}  # type: ignore[arg-type]
    if args.json:
        print(dumps(payload))
    else:
        for k, v in payload.items():
            if k != "checks":
                print(f"{k}: {v}")
        if checks:
            print(
                table(
                    ["CHECK", "STATUS", "EVIDENCE", "FIX"], [(c.id, c.status, c.evidence, c.fix or "") for c in checks]
                )
            )
    from provision.core.diagnostics import failed

    return 1 if failed(checks) else 0
