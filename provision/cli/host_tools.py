"""`provision host-tools`: make (or show) the Debian sid chroot that runs QEMU for the Linux route."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import checks_table, command
from provision.core import values
from provision.core.errors import InvalidValue
from provision.core.result import Result

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
        json=True,
    )
    p.add_argument("--check", action="store_true", help="only report what is there (doctor-style), build nothing")
    p.add_argument("--force", action="store_true", help="rebuild even when a cached chroot exists")
    p.add_argument(
        "--apir",
        action="store_true",
        help="also build virglrenderer with APIR and the host ggml (Vulkan) in the chroot (route apir)",
    )
    p.add_argument(
        "--virgl-src",
        type=Path,
        help="with --apir: a local clone or mirror of the pinned APIR virglrenderer tree, or a git archive of it "
        "(.tar.xz or its folder; checked against the pin)",
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


def run(args: argparse.Namespace) -> Result:
    from provision import hosts

    if not hosts.native_is("linux"):
        raise hosts.wrong_platform(hosts.platform_key(), "provision host-tools (the Linux route's QEMU chroot)",
                                   fix="on macOS the krun bundle is the host side: nix profile add .#krun")  # fmt: skip
    from provision.core.diagnostics import failed
    from provision.hosts.linux import apir_host
    from provision.hosts.linux import tools as host_tools

    if args.virgl_src is not None and not args.apir:
        raise InvalidValue("--virgl-src is only used with --apir", fix="add --apir, or drop --virgl-src")
    if args.virgl_src is not None and not args.virgl_src.is_file():  # a git archive (.tar.xz) is a file
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
    tools = host_tools.locate(settings=args.app.settings)
    return Result(
        {"tools": tools.as_dict() if tools else None, "checks": [c.as_dict() for c in checks]},
        lambda: checks_table(checks),
        exit_status=1 if failed(checks) else 0,
    )


def _bundle(args: argparse.Namespace) -> Result:
    from provision.core.diagnostics import Check, failed
    from provision.hosts.linux import tools_bundle

    if args.bundle is not None and args.from_ is not None:
        raise InvalidValue("--bundle makes a bundle and --from installs one: give one of them")
    checks: list[Check] = []
    if args.host_driver and args.bundle is None:
        raise InvalidValue("--host-driver is only used with --bundle", fix="add --bundle OUT.tar.xz, or drop it")
    if args.from_ is not None:
        payload, checks = tools_bundle.install(args.from_, args.to)
    else:
        if args.to is not None:
            raise InvalidValue("--to is only used with --from")
        payload = tools_bundle.make(args.bundle, args.stack or ["llama-linux"], not args.no_guest,
                                    minimal=args.minimal, host_driver=args.host_driver, apir=args.apir,
                                    virgl_src=args.virgl_src)  # fmt: skip
    lines = [f"{k}: {v}" for k, v in payload.items() if k != "checks"] + ([checks_table(checks)] if checks else [])
    return Result(payload, "\n".join(lines), exit_status=1 if failed(checks) else 0)
