"""The files a running guest writes (its stdout, stderr, console, QEMU's log), read as they grow."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO


class Tail:
    """Copies what a growing file gains to a stream."""

    def __init__(self, path: Path, sink: BinaryIO) -> None:
        self.path, self.sink, self.offset = path, sink, 0

    def pump(self) -> bool:
        """Copy new bytes; True when there were any (the guest made progress)."""
        if not self.path.exists():
            return False
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        if data:
            self.offset += len(data)
            self.sink.write(data)
            self.sink.flush()
        return bool(data)


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace").strip()
    except OSError:
        return "(none)"
