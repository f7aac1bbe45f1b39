"""What one command runs with: its settings and its display, built once by ``main`` and handed down.

Handlers get it as ``args.app`` and hand ``app.settings`` to what they call, so a setting is read
where it was given, not looked up. The display is the logger (``core/log.py``) at the verbosity
asked for: progress at NOTICE (``say``), warnings, errors; ``-q`` keeps only errors and the log
file keeps everything. The idea comes from hatch's ``Application`` (display and verbosity in one
place) and cibuildwheel's frozen options handed to ``build()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from provision.core.log import ROOT, say
from provision.core.settings import Settings


@dataclass(frozen=True)
class App:
    settings: Settings
    verbose: int = 0
    quiet: bool = False

    def say(self, area: str) -> Callable[[str], None]:
        """Progress lines of ``area`` (shown unless ``-q``; always in the log file)."""
        return say(area)

    def warn(self, text: str) -> None:
        logging.getLogger(ROOT).warning("%s", text)
