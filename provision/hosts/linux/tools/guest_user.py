"""The unprivileged ``krun-guest`` user QEMU and the render server run as when provision is root.

It lives in the host-tools tree (``provision host-tools`` adds it; a run adds it to an older
tree), with ids free on the host as well, since the host kernel sees the same numbers. The
drop itself is the chroot step's (``Chroot.as_user``: ``setpriv --no-new-privs`` + ``chroot
--userspec``), before QEMU starts. Why not QEMU's ``-run-with user=``:
provision/core/isolation.py.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from provision.core import locks
from provision.core.errors import InvalidValue
from provision.core.isolation import GUEST_HOME, GUEST_USER, UID_CANDIDATES


@dataclass(frozen=True)
class GuestUser:
    name: str
    uid: int
    gid: int
    home: str  # as programs in the tools tree see it
    groups: tuple[int, ...] = ()  # supplementary: the groups of the device nodes QEMU opens

    def with_device_groups(self, devices: Iterable[Path]) -> GuestUser:
        gids = [self.gid]
        for dev in devices:
            try:
                gid = dev.stat().st_gid
            except OSError:
                continue
            if gid not in gids and gid != 0:
                gids.append(gid)
        return GuestUser(self.name, self.uid, self.gid, self.home, tuple(gids))


def _ids(text: str) -> dict[str, int]:
    """name -> id from passwd or group text (field 3)."""
    out = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            out[parts[0]] = int(parts[2])
    return out


def pick_id(taken: Iterable[int]) -> int:
    used = set(taken)
    for candidate in UID_CANDIDATES:
        if candidate not in used:
            return candidate
    raise InvalidValue(
        f"no free id for {GUEST_USER} in {UID_CANDIDATES.stop + 1}-{UID_CANDIDATES.start}",
        fix="free one of those uids/gids in /etc/passwd and /etc/group",
    )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _append_line(path: Path, line: str) -> None:
    """Add one line to an /etc database whole or not at all (temp file + rename, mode kept)."""
    old = _read(path)
    if old and not old.endswith("\n"):
        old += "\n"
    tmp = path.with_name(f".{path.name}.krun-gpu.tmp")
    tmp.write_text(old + line + "\n")
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    tmp.chmod(mode)
    tmp.rename(path)


def user_in_tree(root: Path) -> tuple[int, int] | None:
    """krun-guest's (uid, gid) in the tools tree, read without changing anything."""
    users = _ids(_read(root / "etc/passwd"))
    groups = _ids(_read(root / "etc/group"))
    if GUEST_USER in users and GUEST_USER in groups:
        return users[GUEST_USER], groups[GUEST_USER]
    return None


def _taken(root: Path, host_etc: Path) -> list[int]:
    users, groups = _ids(_read(root / "etc/passwd")), _ids(_read(root / "etc/group"))
    host_users, host_groups = _ids(_read(host_etc / "passwd")), _ids(_read(host_etc / "group"))
    return [*users.values(), *groups.values(), *host_users.values(), *host_groups.values()]


def planned_user(root: Path, *, host_etc: Path = Path("/etc")) -> GuestUser:
    """``krun-guest`` as ``ensure_user`` would give it, changing nothing (a dry run)."""
    found = user_in_tree(root)
    uid, gid = found if found is not None else (pick_id(_taken(root, host_etc)),) * 2
    return GuestUser(GUEST_USER, uid, gid, GUEST_HOME)


def ensure_user(root: Path, *, host_etc: Path = Path("/etc")) -> GuestUser:
    """``krun-guest`` in the tools tree at ``root``: read if there, else added (idempotent).

    Its uid and gid are free on the host as well as in the tree. Its home is made and
    owned by it. Callers hold the tree's lock or run where nothing else changes it.
    """
    etc = root / "etc"
    users, groups = _ids(_read(etc / "passwd")), _ids(_read(etc / "group"))
    if GUEST_USER in users and GUEST_USER in groups:
        uid, gid = users[GUEST_USER], groups[GUEST_USER]
    else:
        uid = gid = pick_id(_taken(root, host_etc))
        if GUEST_USER not in groups:
            _append_line(etc / "group", f"{GUEST_USER}:x:{gid}:")
        else:
            gid = groups[GUEST_USER]
        _append_line(etc / "passwd", f"{GUEST_USER}:x:{uid}:{gid}:krun-gpu guest runner:{GUEST_HOME}:/usr/sbin/nologin")
    home = root / GUEST_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    st = home.stat()
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(home, uid, gid)
    home.chmod(0o700)
    return GuestUser(GUEST_USER, uid, gid, GUEST_HOME)


def hand_over(paths: Iterable[Path], user: GuestUser) -> None:
    """Create files QEMU writes (its serial logs) and give them to ``user``: the run dir stays root's."""
    for p in paths:
        p.touch(exist_ok=True)
        os.chown(p, user.uid, user.gid)
        p.chmod(0o640)


def run_user(
    tools_root: Path, *, is_chroot: bool, devices: Iterable[Path] = (), dry_run: bool = False
) -> GuestUser | None:
    """The user QEMU and the render server run as, or None when provision is not root
    (they then run as the invoking user) or the tools are the host's own (no tree to enter).
    ``dry_run``: the user the run would add, the tree left as it is."""
    if os.geteuid() != 0 or not is_chroot:
        return None
    if dry_run:
        return planned_user(tools_root).with_device_groups(devices)
    with locks.held(str(tools_root) + ".user.lock"):
        user = ensure_user(tools_root)
    return user.with_device_groups(devices)
