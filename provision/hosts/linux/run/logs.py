"""The files a running guest writes (its stdout, stderr, console, QEMU's log), read as they grow.

Each file has one read offset of its own and only the bytes appended since the last read are
read: a serve runs for days, and two files growing side by side each keep their own place.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import BinaryIO


class Appended:
    """The bytes a growing file gained since the last ``read()``."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return b""  # not written yet
        self.offset += len(data)
        return data


class Lines:
    """The whole lines a growing file gained; a line still being written waits for its newline."""

    def __init__(self, path: Path) -> None:
        self.source, self.partial = Appended(path), b""

    def feed(self, data: bytes) -> list[str]:
        """The complete lines in ``data`` after what came before."""
        *done, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in done]

    def read(self) -> list[str]:
        return self.feed(self.source.read())


class Tail:
    """Copies what a growing file gains to a stream; its lines are also kept for the watch."""

    def __init__(self, path: Path, sink: BinaryIO) -> None:
        self.source, self.sink = Appended(path), sink
        self.lines = Lines(path)

    def pump(self) -> list[str]:
        """Copy new bytes; the whole lines among them."""
        data = self.source.read()
        if data:
            self.sink.write(data)
            self.sink.flush()
        return self.lines.feed(data)


class Marker:
    """Finds a pattern in a growing file, reading each byte once (a short overlap spans reads)."""

    def __init__(self, path: Path, overlap: int = 64) -> None:
        self.source, self.overlap, self.window = Appended(path), overlap, b""

    def search(self, pattern: re.Pattern[bytes]) -> re.Match[bytes] | None:
        self.window = self.window[-self.overlap:] + self.source.read()
        return pattern.search(self.window)


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def tail(path: Path, n: int = 600) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return "(none)"

