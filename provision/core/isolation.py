"""What a guest may reach, as data: QEMU's seccomp sandbox, the name of the unprivileged user
the Linux route runs QEMU and the render server as, and the limits every run gets.

Pure. A guest gets the GPU (GPU runs only), the model and its job (both read-only), and
nothing else: no NIC unless ``serve`` publishes one port, a read-only root disk, bounded
memory, CPUs and run time. On the host, QEMU never runs as root: when provision is root it
enters the host-tools chroot and drops to ``krun-guest`` *before* QEMU starts (``chroot
--userspec``, with no_new_privs set; provision/hosts/linux/tools/guest_user.py), the way libvirt
starts QEMU. QEMU's own ``-run-with user=`` is not used: its privilege drop happens after
``-sandbox`` is installed, so ``elevateprivileges=deny`` would kill QEMU at its own setgid().
"""

from __future__ import annotations

from dataclasses import dataclass

from provision.core import values

GUEST_USER = "krun-guest"
# Inside the host-tools tree: the user's home, where Mesa keeps its shader cache between runs.
GUEST_HOME = "/var/lib/krun-guest"
# Ids tried for the user, highest first: Debian leaves 60000-64999 to be allocated by
# site policy, so these collide with no packaged user. Each must be unused on the host too,
# since the host kernel sees the same numbers.
UID_CANDIDATES = range(64990, 64900, -1)

# QEMU's seccomp sandbox. Every set QEMU has is denied for CPU guests.
SANDBOX_FULL = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
# GPU guests: virglrenderer starts virgl_render_server by fork() + execv() from inside QEMU at
# the guest's first virtio-gpu command, after the filter is installed, and the child calls
# setpgid(0, 0) first; spawn=deny kills the fork, elevateprivileges=deny the setpgid.
# QEMU 11.1 has no way to hand virglrenderer a render server started beforehand
# (virglrenderer's get_server_fd callback is not wired up). What stays denied: obsolete
# syscalls and resource control; QEMU and the render server are already unprivileged with
# no_new_privs, so set*id() cannot gain anything and an exec'd set-uid program runs unprivileged.
SANDBOX_GPU = "on,obsolete=deny,elevateprivileges=allow,spawn=allow,resourcecontrol=deny"


def sandbox_option(gpu: bool) -> str:
    return SANDBOX_GPU if gpu else SANDBOX_FULL


# --- limits -------------------------------------------------------------------------------

DEFAULT_TIMEOUT_S = 3600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_PIDS = 4096
MAX_PIDS = 1 << 20
MIN_PIDS = 16
MIN_MEMORY_MIB = 256


@dataclass(frozen=True)
class GuestLimits:
    """Bounds for one guest. ``memory_mib``/``cpus`` None: the route's own default, which is
    always a number (Linux: 2 CPUs, 2048 MiB, 4096 MiB with GPU; macOS: runplan.DEFAULT_*)."""

    memory_mib: int | None = None
    cpus: int | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    pids: int = DEFAULT_PIDS

    def as_dict(self) -> dict[str, object]:
        return {"memory_mib": self.memory_mib, "cpus": self.cpus, "timeout_s": self.timeout_s, "pids": self.pids}


def check_limits(limits: GuestLimits, *, host_cpus: int, host_memory_mib: int | None) -> GuestLimits:
    """The limits unchanged, or E003 naming the flag, the range and what to pass (core/values.py's checks)."""
    values.int_range(limits.cpus, "--cpus", 1, host_cpus, why=f"this host has {host_cpus} CPUs")
    if limits.memory_mib is not None:
        top = host_memory_mib if host_memory_mib else limits.memory_mib
        values.int_range(limits.memory_mib, "--memory", MIN_MEMORY_MIB, top, why=f"MiB; this host has {top} MiB")
    values.seconds(limits.timeout_s, "--timeout", maximum=MAX_TIMEOUT_S)
    values.int_range(limits.pids, "--pids-limit", MIN_PIDS, MAX_PIDS, why=f"default {DEFAULT_PIDS}")
    return limits
