"""What a command hands back: data for ``--json``, text for a person, and how it ended.

Handlers return a ``Result`` (or a bare exit status, for commands whose output is a guest's own
stream); one renderer (``provision/cli/output.py``) prints it, as text or as one JSON envelope
``{"command", "status", "data", "error"}``, the same shape for successes, failed checks and
errors (the idea comes from pipx's ``result.py``). Pure: nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from provision.core.errors import ProvisionError

Status = Literal["ok", "fail", "error"]


@dataclass(frozen=True)
class Result:
    """``data`` is what ``--json`` prints; ``text`` what a person reads (a callable renders it
    only when asked, so JSON output never pays for tables). ``error`` is a report that also
    failed (``model verify``, ``apir check``): both the data and the error are shown.
    ``exit_status`` is a non-zero end with no E-code (``doctor``: a check failed)."""

    data: Any = None
    text: str | Callable[[], str] | None = None
    error: ProvisionError | None = None
    exit_status: int = 0

    @property
    def status(self) -> Status:
        if self.error is not None:
            return "error"
        return "ok" if self.exit_status == 0 else "fail"

    @property
    def exit(self) -> int:
        return self.error.exit_status if self.error is not None else self.exit_status

    def render_text(self) -> str | None:
        return self.text() if callable(self.text) else self.text


def envelope(command: str, result: Result | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON shape every command prints with ``--json``."""
    if result is None:
        return {"command": command, "status": "error", "data": None, "error": error}
    err = result.error.as_dict() if result.error is not None else error
    return {"command": command, "status": result.status, "data": result.data, "error": err}


def as_result(outcome: Result | int | None) -> Result:
    """A handler's return value as a Result (a bare int is an exit status with no data)."""
    if isinstance(outcome, Result):
        return outcome
    status = int(outcome or 0)
    return Result(data={"exit_status": status}, exit_status=status)
