"""An append-only JSON Lines file (the bench history's): one record a line, appended whole.

Each record is one ``write(2)`` of one line on a descriptor opened with ``O_APPEND``, under an
exclusive ``flock``: two provision processes appending at once never interleave their bytes, and
a process killed mid-append leaves at most one torn last line, which ``read`` skips (and counts)
instead of failing on it. The file is never rewritten, so a record once written stays.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.core.errors import DiskFull, InvalidValue
from provision.core.outputs import is_disk_error


def append(path: Path, record: dict[str, Any]) -> None:
    """Add ``record`` as the file's last line; the file is created (0644) on first use."""
    line = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InvalidValue(f"cannot open the history {path}: {exc.strerror}",
                           fix=f"make {path.parent} writable") from None  # fmt: skip
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _repair_tail(fd)
        written = os.write(fd, line)
        if written != len(line):  # a short write (ulimit -f, disk full) would leave a torn line: undo it
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise DiskFull(f"the history {path} took {written} of {len(line)} bytes; the record was not kept")
        os.fsync(fd)
    except OSError as exc:
        if is_disk_error(exc):
            raise DiskFull(f"appending to the history {path}: {os.strerror(exc.errno or 0)}; the record was not kept",
                           fix="free space or raise the file size limit (ulimit -f)") from None
        raise
    finally:
        os.close(fd)  # closing drops the lock


def _repair_tail(fd: int) -> None:
    """A torn last line (a writer killed mid-write) gets its newline, so the next record starts a line of its own."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


@dataclass(frozen=True)
class Lines:
    records: list[dict[str, Any]]
    skipped: int  # lines that were not a JSON object (torn by a killed writer, or edited by hand)


def read(path: Path) -> Lines:
    """Every whole record, oldest first; no file is an empty history."""
    try:
        with path.open("rb") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)  # no half-appended line is read
            data = fh.read()
    except FileNotFoundError:
        return Lines([], 0)
    except OSError as exc:
        raise InvalidValue(f"cannot read the history {path}: {exc.strerror}", fix=f"check {path}") from None
    records, skipped = [], 0
    for raw in data.splitlines():
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            skipped += 1
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            skipped += 1
    return Lines(records, skipped)
