"""Blob files of the model store: hashing, the GGUF magic, durable writes. Imports core only."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
HASH_BLOCK = 8 << 20
DISK_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def hash_file(path: Path, limit: int | None = None) -> tuple[Any, int]:
    """sha256 object and byte count of ``path`` (its first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    done = 0
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while limit is None or done < limit:
            want = HASH_BLOCK if limit is None else min(HASH_BLOCK, limit - done)
            n = f.readinto(view[:want])
            if not n:
                break
            h.update(view[:n])
            done += n
    return h, done


def has_magic(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == GGUF_MAGIC
