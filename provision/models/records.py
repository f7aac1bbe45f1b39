"""The store's refs (refs/NAME.json: name -> sha256, size, source, pin status), validated on read.

A file under refs/ that is not a ref the store could have written (edited, truncated, not
UTF-8) is a DamagedRef: listed as damaged, removable by name, never trusted. Imports core only.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=,-]{0,199}$")
_ROLE = re.compile(r"^[a-z]{1,32}$")


@dataclass(frozen=True)
class Ref:
    name: str
    sha256: str
    size: int
    source: str
    pinned: bool
    pin_status: str | None
    # A split GGUF: every part in order ({"sha256", "size", "file"}); the first is ``sha256``.
    parts: list[dict[str, Any]] | None = None
    # Small layers kept beside the model, by role (ollama's template, params): {"sha256", "size"}.
    extras: dict[str, dict[str, Any]] | None = None
    # Read out of an image layer: that layer's sha256, so pulling the same image again fetches nothing.
    layer: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {k: v for k, v in data.items() if v is not None or k in REQUIRED}

    def blobs(self) -> list[tuple[str, int]]:
        """Every (sha256, size) of GGUF bytes this ref needs: the file, or each part."""
        return [(p["sha256"], p["size"]) for p in self.parts] if self.parts else [(self.sha256, self.size)]

    def extra_blobs(self) -> list[tuple[str, int]]:
        return [(e["sha256"], e["size"]) for e in (self.extras or {}).values()]


@dataclass(frozen=True)
class DamagedRef:
    """A file under refs/ that is no ref the store could have written (edited, truncated, foreign)."""

    name: str
    path: Path
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "damaged": self.reason}


class DamagedRefError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def load_ref(path: Path) -> Ref:
    """The ref stored at ``path``; DamagedRefError when it is not one the store could have written."""
    if not path.is_file():  # a FIFO would block the reader, a directory cannot be read
        raise DamagedRefError("not a regular file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DamagedRefError("not UTF-8 text") from None
    except OSError as exc:
        raise DamagedRefError(f"unreadable ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DamagedRefError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise DamagedRefError("not a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DamagedRefError(f"missing {', '.join(missing)}")
    checks = {
        "name": data["name"] == path.stem,
        "sha256": isinstance(data["sha256"], str) and _SHA256_HEX.match(data["sha256"]) is not None,
        "size": isinstance(data["size"], int) and not isinstance(data["size"], bool) and data["size"] >= 0,
        "source": isinstance(data["source"], str) and bool(data["source"]),
        "pinned": isinstance(data["pinned"], bool),
        "pin_status": data["pin_status"] is None or isinstance(data["pin_status"], str),
        "parts": "parts" not in data or _parts_ok(data["parts"], data["sha256"]),
        "extras": "extras" not in data or _extras_ok(data["extras"]),
        "layer": "layer" not in data or (isinstance(data["layer"], str) and bool(_SHA256_HEX.match(data["layer"]))),
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise DamagedRefError("bad " + ", ".join(f"{k}={data[k]!r}"[:80] for k in bad))
    return Ref(**{k: data[k] for k in Ref.__dataclass_fields__ if k in data})


def _blob_ok(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and _SHA256_HEX.match(entry["sha256"]) is not None
        and isinstance(entry.get("size"), int)
        and not isinstance(entry["size"], bool)
        and entry["size"] >= 0
    )


def _parts_ok(parts: Any, first: Any) -> bool:
    if not isinstance(parts, list) or not 2 <= len(parts) <= 999 or not all(_blob_ok(p) for p in parts):
        return False
    names = [p.get("file") for p in parts]
    files_ok = all(isinstance(n, str) and _FILE.match(n) for n in names) and len(set(names)) == len(parts)
    return files_ok and parts[0]["sha256"] == first


def _extras_ok(extras: Any) -> bool:
    return isinstance(extras, dict) and all(_ROLE.match(str(k)) and _blob_ok(v) for k, v in extras.items())


REQUIRED = ("name", "sha256", "size", "source", "pinned", "pin_status")
