"""A Linux run's privilege drop: who QEMU and the render server run as, and what they may write.

When provision is root and the tools are the host-tools chroot, every program of the run
enters the chroot as ``krun-guest`` (provision/hosts/linux/tools/guest_user.py) with no_new_privs,
in the supplementary groups of the device nodes QEMU opens (``/dev/kvm``, render nodes).
QEMU then writes only its three serial logs, which are handed to that user; the run
directory stays root's. The drop happens in the chroot step, after ``procs.spawn`` made the
process group: the group (what the reaper and ``procs.stop`` signal) is the same after it.
The kernel clears PDEATHSIG at the change of user, so a root provision's children rely on
the reaper, which runs as root and can signal them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from provision.hosts.linux.tools import guest_user
from provision.hosts.linux.tools.guest_user import GuestUser


def guest_devices(accel: str, gpu: bool, dri: Path = Path("/dev/dri")) -> list[Path]:
    devices = [Path("/dev/kvm")] if accel == "kvm" else []
    if gpu and dri.is_dir():
        devices += sorted(dri.glob("renderD*"))
    return devices


def run_user(tools_root: Path, *, is_chroot: bool, accel: str, gpu: bool, dry_run: bool) -> GuestUser | None:
    """Who QEMU runs as (None: provision's own user); a dry run changes nothing to find out."""
    return guest_user.run_user(tools_root, is_chroot=is_chroot, devices=guest_devices(accel, gpu), dry_run=dry_run)


def hand_over(logs: Iterable[Path], terminal: str | None, user: GuestUser | None) -> None:
    """Give ``user`` what QEMU writes: its serial logs (made here), and for `provision shell` the pty
    slave it opens as a serial port (provision made it; QEMU could not open it otherwise)."""
    if user is None:
        return
    guest_user.hand_over(logs, user)
    if terminal is not None:
        os.chown(terminal, user.uid, -1)  # the tty group (mode 0620) stays: only its owner may read it


def log_fields(user: GuestUser | None) -> str:
    """What the run's first log line adds (the e2e tests read the user from it)."""
    return f" user={user.name}({user.uid})" if user is not None else ""
