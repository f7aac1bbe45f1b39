"""Run programs inside a chroot (the host-tools tree) with /proc, /sys and /dev mounted.

The mounts are made in a private mount namespace created for that one process
(``unshare --mount --propagation private``), so they vanish when the process exits, even
on SIGKILL: nothing is left mounted on the host and concurrent runs never unmount each
other's /dev. ``unshare`` and ``chroot`` exec into the program, so the pid of the Popen
is the pid of the program itself (QEMU): killing and reaping it needs no tree walk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# What the script does, in order: mount the kernel file systems, bind the host
# directories the program needs (kernel, disks, logs live in provision's cache, outside
# the chroot), then exec chroot + env -i so the program sees only the environment given.
# With a user, chroot drops to it (numeric uid:gid, supplementary groups) before the
# program starts; the program never runs as root.
_SETUP = r"""
set -e
root=$1; user=$2; shift 2
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --rbind /dev "$root/dev"
while [ "$1" != "--" ]; do
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  shift 2
done
shift
if [ -n "$user" ]; then
  exec chroot --userspec="${user%%/*}" --groups="${user#*/}" "$root" "$@"
fi
exec chroot "$root" "$@"
"""

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Chroot:
    """A directory tree to run programs in; ``binds`` maps host dirs to paths inside it."""

    root: Path
    binds: Mapping[Path, str] = field(default_factory=dict)
    # (uid, gid, supplementary gids) the program runs as; None keeps root.
    run_as: tuple[int, int, tuple[int, ...]] | None = None

    def with_binds(self, binds: Mapping[Path, str]) -> Chroot:
        merged = dict(self.binds)
        merged.update(binds)
        return Chroot(self.root, merged, self.run_as)

    def as_user(self, uid: int, gid: int, groups: Sequence[int] = ()) -> Chroot:
        return Chroot(self.root, self.binds, (uid, gid, tuple(groups) or (gid,)))

    def inside(self, host_path: Path) -> str:
        """The path a program in the chroot uses for ``host_path`` (which must lie under a bind)."""
        host_path = host_path.resolve()
        for src, dst in self.binds.items():
            try:
                rel = host_path.relative_to(src.resolve())
            except ValueError:
                continue
            return str(Path(dst) / rel)
        raise ValueError(f"{host_path} is not visible inside {self.root} (binds: {dict(self.binds)})")

    @staticmethod
    def environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The whole environment ``program`` gets from ``argv`` (``env -i``: nothing else passes)."""
        return {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", **(env or {})}

    def argv(self, program: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """The host command line that runs ``program`` inside the chroot with a clean env."""
        env_items = self.environment(env)
        binds: list[str] = []
        for src, dst in self.binds.items():
            if not dst.startswith("/") or ".." in Path(dst).parts:
                raise ValueError(f"bind target must be an absolute path without '..': {dst!r}")
            binds += [str(src.resolve()), dst]
        user = ""
        prefix: list[str] = []
        if self.run_as is not None:
            uid, gid, groups = self.run_as
            user = f"{int(uid)}:{int(gid)}/" + ",".join(str(int(g)) for g in groups)
            # no_new_privs survives the drop and every exec after it: a set-uid program in
            # the tree cannot give the unprivileged program root back.
            prefix = ["setpriv", "--no-new-privs"]
        return [
            *prefix,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _SETUP,
            "krun-chroot",
            str(self.root.resolve()),
            user,
            *binds,
            "--",
            "/usr/bin/env",
            "-i",
            *(f"{k}={v}" for k, v in env_items.items()),
            *program,
        ]
