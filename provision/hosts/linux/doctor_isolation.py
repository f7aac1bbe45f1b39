"""Doctor checks: the isolation a Linux guest gets on this host (provision/core/isolation.py), as evidence.

QEMU's seccomp sandbox, the user QEMU and the render server run as, the guest's
network, which disks are read-only and the limits a run gets.
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.core import isolation
from provision.core.diagnostics import Check, DoctorContext
from provision.hosts.linux import guest_user


def user_check(euid: int, tools_root: Path | None, is_chroot: bool) -> Check:
    cid = "linux.isolation.user"
    if euid != 0:
        return Check(cid, "ok", f"provision is not root: QEMU and the render server run as uid {euid} (you)")
    if tools_root is None or not is_chroot:
        return Check(
            cid,
            "warn",
            "provision is root and its host tools are not a chroot (the host's own QEMU, or a `--from` bundle): "
            "QEMU and the render server run as root",
            fix="run provision as a normal user (the host's QEMU and a bundle need no root), "
            "or use `provision host-tools` (its chroot drops them to the unprivileged krun-guest user)",
        )
    ids = guest_user.user_in_tree(tools_root)
    who = f"uid {ids[0]}, gid {ids[1]}" if ids else "added at the next run"
    return Check(
        cid,
        "ok",
        f"QEMU and the render server drop from root to {isolation.GUEST_USER} ({who}) with no_new_privs "
        "before they start",
    )


def static_checks() -> list[Check]:
    """What holds on every Linux run, whoever runs it."""
    return [
        Check(
            "linux.isolation.sandbox",
            "ok",
            f"QEMU -sandbox {isolation.SANDBOX_FULL} for CPU guests; {isolation.SANDBOX_GPU} for GPU guests "
            "(virglrenderer forks the render server from inside QEMU)",
        ),
        Check(
            "linux.isolation.network",
            "ok",
            "no NIC (-nic none): the guest has only lo and reaches no network; serve alone forwards one port "
            "(restrict=on user networking)",
        ),
        Check(
            "linux.isolation.mounts",
            "ok",
            "root disk, job and model attached readonly=on (root mounted ro); QEMU writes only its three serial logs",
        ),
        Check(
            "linux.isolation.limits",
            "ok",
            f"run time {isolation.DEFAULT_TIMEOUT_S:g} s, 2 CPUs, 2048 MiB (4096 MiB with GPU) unless "
            "--timeout/--cpus/--memory say otherwise",
        ),
    ]


def isolation_checks(ctx: DoctorContext) -> list[Check]:
    from provision.hosts.linux import tools as host_tools

    tools = host_tools.locate()
    user = user_check(os.geteuid(), tools.root if tools else None, bool(tools and tools.is_chroot))
    return [*static_checks(), user]
