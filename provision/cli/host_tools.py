"""`provision host-tools`: make (or show) the Debian sid chroot that runs QEMU for the Linux route."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import checks_table, command
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
        help="with --bundle: cut each guest disk to what runs: no lavapipe, no LLVM, "
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
    from provision.core.diagnostics import failed

    req = hosts.ToolsRequest(
        check=args.check, force=args.force, apir=args.apir, virgl_src=args.virgl_src, bundle=args.bundle,
        stacks=tuple(args.stack or ["llama-linux"]), minimal=args.minimal, guest=not args.no_guest,
        host_driver=args.host_driver, install_from=args.from_, install_to=args.to,
    )  # fmt: skip
    done = hosts.native().prepare(req)
    checks = list(done.checks)
    if done.lines:  # a bundle made or installed: what it holds, then the installed tools' checks
        text = "\n".join([*done.lines, *([checks_table(checks)] if checks else [])])
        return Result(dict(done.data), text, exit_status=1 if failed(checks) else 0)
    return Result(dict(done.data), lambda: checks_table(checks), exit_status=1 if failed(checks) else 0)
