"""A Linux run's privilege drop: who QEMU and the render server run as, and what they may write.

When provision is root and the tools are the host-tools chroot, every program of the run
enters the chroot as ``krun-guest`` (provision/hosts/linux/guest_user.py) with no_new_privs,
in the supplementary groups of the device nodes QEMU opens (``/dev/kvm``, render nodes).
QEMU then writes only its three serial logs, which are handed to that user; the run
directory stays root's. The drop happens in the chroot step, after ``procs.spawn`` made the
process group: the group (what the reaper and ``procs.stop`` signal) is the same after it.
The kernel clears PDEATHSIG at the change of user, so a root provision's children rely on
the reaper, which runs as root and can signal them.
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.adapters.chroot import Chroot
from provision.hosts.linux import guest_user
from provision.hosts.linux.guest_user import GuestUser

# The files QEMU itself opens for writing (its serial logs); everything else it opens read-only.
QEMU_WRITES = ("console.log", "stdout.log", "stderr.log")


def guest_devices(accel: str, gpu: bool, dri: Path = Path("/dev/dri")) -> list[Path]:
    devices = [Path("/dev/kvm")] if accel == "kvm" else []
    if gpu and dri.is_dir():
        devices += sorted(dri.glob("renderD*"))
    return devices


def drop(
    tools_root: Path, chroot: Chroot | None, run_dir: Path, *, accel: str, gpu: bool, terminal: str | None = None
) -> tuple[Chroot | None, GuestUser | None]:
    """The chroot that runs the run's programs as ``krun-guest`` (unchanged when there is no drop) and that user.

    ``terminal``: a pty slave QEMU opens as a serial port (``provision shell``); it is handed
    to the user too, since provision made it and QEMU could not open it otherwise.
    """
    devices = guest_devices(accel, gpu)
    user = guest_user.run_user(tools_root, is_chroot=chroot is not None, devices=devices)
    if user is None or chroot is None:
        return chroot, None
    guest_user.hand_over([run_dir / name for name in QEMU_WRITES], user)
    if terminal is not None:
        os.chown(terminal, user.uid, -1)  # the tty group (mode 0620) stays: only its owner may read it
    return chroot.as_user(user.uid, user.gid, user.groups), user


def log_fields(user: GuestUser | None) -> str:
    """What the run's first log line adds (the e2e tests read the user from it)."""
    return f" user={user.name}({user.uid})" if user is not None else ""
