"""Checks for command-line values that reach a shell plan, a path, a template or a slow step.

Pure. Each check returns the value or raises E003 naming the option and the value, so a bad
value is refused before anything starts (a VM, a build, a download).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from provision.core.errors import InvalidValue

# podman machine names (and so file names under the machine state dir): one path component.
_MACHINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# An OCI image reference: [registry[:port]/]path[:tag][@digest], lower-case path components.
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9._-]*(?::[0-9]{1,5})?(?:/[a-z0-9][a-z0-9._-]*)*"
                        r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$")  # fmt: skip
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def machine_name(value: str, flag: str = "--machine") -> str:
    if not _MACHINE.match(value) or ".." in value:
        raise InvalidValue(
            f"{flag} {value!r}: not a machine name (letters, digits and _ . -, at most 63, no '/' or '..')",
            fix=f"e.g. {flag} podman-machine-default",
        )
    return value


def image_ref(value: str, flag: str) -> str:
    if len(value) > 255 or not _IMAGE_REF.match(value) or ".." in value:
        raise InvalidValue(
            f"{flag} {value!r}: not an image reference ([host[:port]/]name[:tag], lower-case name)",
            fix=f"e.g. {flag} localhost/krun-gpu/llama:dev",
        )
    return value


def seconds(value: float | None, flag: str, *, maximum: float = 7 * 24 * 3600) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0 or value > maximum:
        raise InvalidValue(
            f"{flag} {value!r}: must be a number of seconds above 0 and at most {maximum:g}", fix=f"e.g. {flag} 600"
        )
    return value


def int_range(value: int | None, flag: str, low: int, high: int, *, why: str = "") -> int | None:
    if value is None:
        return None
    if not low <= value <= high:
        raise InvalidValue(
            f"{flag} {value}: must be between {low} and {high}" + (f" ({why})" if why else ""),
            fix=f"e.g. {flag} {max(low, min(high, 2))}",
        )
    return value


def plain_path(value: str | None, flag: str, *, absolute: bool = False) -> str | None:
    """A path that goes into an environment variable or plan: no control characters (no new lines)."""
    if value is None:
        return None
    if not value.strip() or _CONTROL.search(value) or (absolute and not value.startswith("/")):
        need = "an absolute path" if absolute else "a path"
        raise InvalidValue(f"{flag} {value!r}: not {need} without control characters", fix=f"e.g. {flag} /tmp/logs")
    return value


def existing_dir(value: Path | None, flag: str) -> Path | None:
    if value is None:
        return None
    if not value.is_dir():
        raise InvalidValue(f"{flag} {value}: no such directory", fix=f"point {flag} at an existing directory")
    return value


def token(value: str | None, flag: str, pattern: str = r"^[A-Za-z0-9][A-Za-z0-9;,._-]{0,63}$") -> str | None:
    if value is None:
        return None
    if not re.match(pattern, value):
        raise InvalidValue(f"{flag} {value!r}: not a plain value (letters, digits and ; , . _ -)", fix="see --help")
    return value
