"""SIGTERM and SIGHUP end provision the way Ctrl-C does, with exit status 128 + N.

``stop_on_signals()`` (called by the CLI's main) makes all three raise ``KeyboardInterrupt``
(``Terminated`` for SIGTERM/SIGHUP), so every ``finally`` on the way out stops its children
(adapters/procs.py) and provision exits 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP).
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so every ``finally`` stops its children; exit 128+N."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP unwind provision like Ctrl-C (main thread only).

    After the first, further ones are ignored so they cannot cut the teardown short; a user in
    a hurry sends SIGKILL, and the reaper stops the children.
    """

    raised: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        # Not SIG_IGN: an ignored signal would stay ignored in every child started later.
        if raised:
            return
        raised.append(signum)
        raise KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)


def exit_status(exc: KeyboardInterrupt) -> int:
    """128 + the signal's number: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + (exc.signum if isinstance(exc, Terminated) else signal.SIGINT)
