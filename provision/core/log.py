"""stdlib logging for provision: ``-v``/``-q`` on stderr, and one log file per invocation.

Every module logs to ``logging.getLogger("provision.<area>")``. stderr shows progress (NOTICE,
``say``) and warnings (``-q``: errors only; ``-v``: info, which includes each program provision
runs; ``-vv``: debug). The
file, ``<state>/logs/<time>-<pid>-<command>.log``, always gets debug; the newest ``KEEP`` stay
(the idea comes from pipx's per-command log). A log file that cannot be written never fails
a command: the stderr handler still works.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = "provision"
KEEP = 30
_OURS = "_provision_handler"
# Progress a person watching should see (what a long step is doing): shown by default, hidden by -q.
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")


def level_for(verbose: int, quiet: bool) -> int:
    if quiet:
        return logging.ERROR
    return {0: NOTICE, 1: logging.INFO}.get(verbose, logging.DEBUG)


def say(area: str) -> Callable[[str], None]:
    """A ``log(text)`` for progress lines of ``area`` (``provision.<area>``), at NOTICE."""
    logger = logging.getLogger(f"{ROOT}.{area}")
    return lambda text: logger.log(NOTICE, "%s", text)


class _Stderr(logging.Handler):
    """Writes to whatever sys.stderr is now (tests redirect it per command)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging never fails a command
            self.handleError(record)


class _Plain(logging.Formatter):
    """``provision: message``; progress lines (NOTICE) name their area themselves, as they always did."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno == NOTICE else f"provision: {text}"


def setup(verbose: int = 0, quiet: bool = False, log_dir: Path | None = None, command: str = "") -> Path | None:
    """(Re)configure the ``provision`` logger for one invocation; return the log file, if one was opened."""
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if getattr(h, _OURS, False)]:
        logger.removeHandler(h)
        h.close()
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    err = _Stderr()
    err.setLevel(level_for(verbose, quiet))
    err.setFormatter(_Plain())
    setattr(err, _OURS, True)
    logger.addHandler(err)
    if log_dir is None:
        return None
    slug = "".join(ch if ch.isalnum() else "-" for ch in command)[:40] or "provision"
    path = log_dir / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{slug}.log"
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        return None
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    setattr(handler, _OURS, True)
    logger.addHandler(handler)
    _prune(log_dir)
    return path


def _prune(log_dir: Path) -> None:
    with contextlib.suppress(OSError):
        old = sorted(log_dir.glob("*.log"))[:-KEEP]
        for p in old:
            with contextlib.suppress(OSError):
                p.unlink()


def close() -> None:
    """Close the file handler (the end of one in-process invocation)."""
    logger = logging.getLogger(ROOT)
    for h in [h for h in logger.handlers if isinstance(h, logging.FileHandler) and getattr(h, _OURS, False)]:
        logger.removeHandler(h)
        h.close()
