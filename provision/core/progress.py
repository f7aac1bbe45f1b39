"""Progress of a long byte transfer: a redrawn bar on a TTY, plain lines otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_MIB = 1024 * 1024


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """``update(done)`` as bytes arrive; ``finish()`` once. Rate and ETA count only this run's bytes."""

    def __init__(self, label: str, total: int | None, *, start: int = 0, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.start = start
        self.done = start
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._next_pct = 10
        if start and total:
            self._next_pct = (start * 100 // total) // 10 * 10 + 10
            self._line(f"resuming at {_human(start)} of {_human(total)}")

    def _line(self, text: str) -> None:
        self.stream.write(f"{self.label}: {text}\n")
        self.stream.flush()

    def _status(self) -> str:
        elapsed = max(time.monotonic() - self.t0, 1e-6)
        rate = (self.done - self.start) / elapsed
        parts = [_human(self.done) + (f" / {_human(self.total)}" if self.total else "")]
        parts.append(f"{rate / _MIB:.1f} MiB/s")
        if self.total and rate > 0:
            parts.append(f"ETA {_clock((self.total - self.done) / rate)}")
        return "  ".join(parts)

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty:
            if now - self._last_draw < 0.1:
                return
            self._last_draw = now
            pct = f"{100 * done / self.total:5.1f}% " if self.total else ""
            width = 30
            fill = int(width * done / self.total) if self.total else 0
            self.stream.write(f"\r{self.label}: [{'#' * fill}{'.' * (width - fill)}] {pct}{self._status()}\x1b[K")
            self.stream.flush()
        elif self.total and done * 100 >= self._next_pct * self.total:
            self._line(f"{done * 100 // self.total:3d}%  {self._status()}")
            self._next_pct = done * 100 // self.total // 10 * 10 + 10

    def finish(self, note: str = "done") -> None:
        elapsed = time.monotonic() - self.t0
        if self.tty:
            self.stream.write("\r\x1b[K")
        self._line(f"{note}: {_human(self.done - self.start)} in {elapsed:.1f}s ({self._status()})")
