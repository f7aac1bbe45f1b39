"""Files we write for the user (--output): whole or not at all, and never over a file we did not write.

Each file is produced under a temporary name beside its target, flushed to disk, then moved
into place: a failure (disk full, ``ulimit -f``, Ctrl-C) leaves the target as it was. Without
``--force`` an existing target is only replaced when ``ours(target)`` says provision wrote it,
and a file that appears while we write is kept (the move is a hard link, which never replaces).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from provision.core.errors import DiskFull, InvalidValue

DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def is_disk_error(exc: OSError) -> bool:
    """Out of space or over the file size limit. Writers that check their own short writes
    (numpy's tofile: "N requested and M written") raise an OSError without errno for it."""
    return exc.errno in DISK_ERRNOS or (exc.errno is None and "written" in str(exc))


def output_path(value: str | None, flag: str) -> Path | None:
    """The path a --output option names, refusing values that are no path at all ("" is not ".")."""
    if value is None:
        return None
    if not value.strip() or any(c in value for c in "\0\n\r"):
        raise InvalidValue(f"{flag} {value!r}: not a path", fix=f"give {flag} a path, e.g. {flag} ./out")
    return Path(value).expanduser()


def _disk_or_value(exc: OSError, target: Path, flag: str) -> Exception:
    if is_disk_error(exc):
        why = os.strerror(exc.errno) if exc.errno else f"short write ({exc})"
        return DiskFull(
            f"writing {flag} {target}: {why}; {target} was left as it was",
            fix="free space or raise the file size limit (ulimit -f), or write elsewhere",
        )
    return InvalidValue(
        f"cannot write {flag} {target}: {exc.strerror or exc}; {target} was left as it was",
        fix=f"pick a writable place for {flag}",
    )


def check_target(target: Path, flag: str, *, force: bool, ours: Callable[[Path], bool] = lambda _p: False) -> bool:
    """Whether ``target`` may be (re)placed; E003 when it may not. True when it exists already."""
    if target.is_dir():
        raise InvalidValue(f"{flag} {target} is a directory, not a file", fix=f"name a file with {flag}")
    exists = target.exists() or target.is_symlink()
    if target.exists() and not target.is_file():  # a device, a FIFO, a socket: never ours to replace
        raise InvalidValue(f"{flag} {target} is not a regular file; it is left alone", fix=f"name a file with {flag}")
    if exists and not force and not ours(target):
        raise InvalidValue(
            f"{flag} {target} exists and was not written by provision; it is left as it is",
            fix=f"pass --force to replace it, or pick another {flag}",
        )
    parent = target.parent
    if not parent.is_dir():
        raise InvalidValue(f"{flag} {target}: directory {parent} does not exist", fix=f"create {parent} first")
    return exists


def write_file(
    target: Path,
    produce: Callable[[Path], object],
    *,
    flag: str,
    force: bool,
    ours: Callable[[Path], bool] = lambda _p: False,
) -> None:
    """``produce(tmp)`` writes the content to ``tmp``; it lands at ``target`` only when complete."""
    replace = check_target(target, flag, force=force, ours=ours)
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _disk_or_value(exc, target, flag) from None
    os.close(fd)
    tmp = Path(name)
    try:
        produce(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        if replace:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)  # fails if someone created target meanwhile: theirs stays
            except FileExistsError:
                raise InvalidValue(
                    f"{flag} {target} appeared while provision was writing it; it is left as it is",
                    fix=f"pass --force to replace it, or pick another {flag}",
                ) from None
        with contextlib.suppress(OSError):
            dfd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except OSError as exc:
        raise _disk_or_value(exc, target, flag) from None
    finally:
        tmp.unlink(missing_ok=True)


def write_text(
    target: Path, text: str, *, flag: str, force: bool, ours: Callable[[Path], bool] = lambda _p: False
) -> None:
    write_file(target, lambda tmp: tmp.write_text(text, encoding="utf-8"), flag=flag, force=force, ours=ours)
