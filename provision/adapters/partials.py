"""Half-made things a killed command leaves behind, and how the next command removes them.

Everything provision builds is made under a temporary name beside its final one and renamed
into place only when complete (``<key>.building``, ``<name>.partial``, ``<key>.staging``), so a
half-made thing is never used as if whole; the next command that makes the same thing removes
the leftover under the same lock first. A leftover may still have file systems mounted in it
(debootstrap mounts /proc and /sys in its target; older provisions ran it in the host's mount
namespace): those are unmounted first, so removing it never walks into the host's /proc.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from provision.adapters import runner


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal escapes.
    out, i = "", 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out += chr(int(field[i + 1 : i + 4], 8))
            i += 4
        else:
            out += field[i]
            i += 1
    return out


def mounts_below(path: Path, mountinfo: str | None = None) -> list[Path]:
    """Mount points at or under ``path`` in this mount namespace, deepest first."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    top = Path(os.path.realpath(path))
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            point = Path(_unescape(fields[4]))
            if point == top or top in point.parents:
                found.append(point)
    return sorted(set(found), key=lambda p: len(p.parts), reverse=True)


def remove(path: Path) -> None:
    """Remove a leftover file or tree, unmounting whatever is mounted below it first."""
    if not path.exists() and not path.is_symlink():
        return
    for point in mounts_below(path):
        runner.run(["umount", "--lazy", str(point)])  # what it cannot unmount, rmtree then reports
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
