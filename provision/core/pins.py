"""The one pins file (``provision/data/pins.json``): every upstream version, rev and hash.

flake.nix reads the same file with ``builtins.fromJSON``; nothing else in the project
spells a version or hash. Loading validates shapes so a typo fails here, naming the key.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from provision.core.errors import CatalogSyntaxError, InvalidValue, UnverifiedPin

STATUSES = ("VERIFIED", "COMPUTED", "READ", "UNVERIFIED")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_SRI = re.compile(r"^sha256-[A-Za-z0-9+/]{43}=$")
_REV = re.compile(r"^[0-9a-f]{40}$")


def default_path() -> Path:
    return Path(str(resources.files("provision") / "data" / "pins.json"))


@dataclass(frozen=True)
class SourcePin:
    name: str
    fetcher: str
    status: str
    provenance: str
    attrs: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.attrs[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    @property
    def verified_enough(self) -> bool:
        return self.status != "UNVERIFIED"


@dataclass(frozen=True)
class ModelPin:
    """A catalog model: fetched from ``hf`` (hf://OWNER/REPO/FILE@REV) or, when ``synth`` names a
    generator, written locally by ``provision model synth`` (then ``hf`` is None)."""

    name: str
    hf: str | None
    sha256: str
    size: int
    status: str
    provenance: str
    synth: str | None = None


@dataclass(frozen=True)
class Pins:
    path: Path
    raw: dict[str, Any]
    sources: dict[str, SourcePin]
    models: dict[str, ModelPin]

    def source(self, name: str) -> SourcePin:
        try:
            return self.sources[name]
        except KeyError:
            raise InvalidValue(
                f"{self.path}: sources.{name}: no such pin (known: {', '.join(sorted(self.sources))})"
            ) from None

    def require(self, name: str, *, purpose: str) -> SourcePin:
        """Return a source pin, refusing one that nobody could verify."""
        pin = self.source(name)
        if not pin.verified_enough:
            raise UnverifiedPin(
                f"{purpose} needs sources.{name} from {self.path}, which is UNVERIFIED ({pin.provenance})",
                fix=f"verify sources.{name} and set its status in {self.path}",
            )
        return pin

    @property
    def fedora(self) -> dict[str, Any]:
        return dict(self.raw["fedora"])

    @property
    def debian(self) -> dict[str, Any]:
        return dict(self.raw["debian"])

    @property
    def python(self) -> dict[str, str]:
        return dict(self.raw["python"])

    @property
    def compat(self) -> dict[str, Any]:
        return dict(self.raw["compat"])

    def debian_packages(self, *, purpose: str) -> dict[str, str]:
        deb = self.debian
        if deb.get("status") == "UNVERIFIED":
            raise UnverifiedPin(
                f"{purpose} needs debian.packages from {self.path}, which is UNVERIFIED ({deb.get('provenance')})",
                fix=f"read the versions with apt-cache policy in a {deb.get('suite')} chroot and update {self.path}",
            )
        return dict(deb["guest_packages"])


def _check(cond: bool, path: Path, key: str, value: object, why: str) -> None:
    if not cond:
        raise InvalidValue(f"{path}: {key} = {value!r}: {why}")


def parse(data: Any, path: Path) -> Pins:
    _check(isinstance(data, dict), path, "<root>", type(data).__name__, "expected a JSON object")
    for top in ("sources", "fedora", "debian", "models", "python", "compat"):
        _check(top in data, path, top, None, "missing section")
    sources: dict[str, SourcePin] = {}
    for name, entry in data["sources"].items():
        key = f"sources.{name}"
        _check(isinstance(entry, dict), path, key, entry, "expected an object")
        status = entry.get("status")
        _check(status in STATUSES, path, f"{key}.status", status, f"must be one of {', '.join(STATUSES)}")
        for hkey in ("hash", "cargoHash"):
            if hkey in entry:
                _check(
                    bool(_SRI.match(str(entry[hkey]))),
                    path,
                    f"{key}.{hkey}",
                    entry[hkey],
                    "not an SRI sha256 (sha256-<base64>=)",
                )
        if "sha256" in entry:
            _check(
                bool(_SHA256_HEX.match(str(entry["sha256"]))),
                path,
                f"{key}.sha256",
                entry["sha256"],
                "not 64 lowercase hex digits",
            )
            # a recipe's hex sha256 and the SRI hash Nix fetches with are one fact in two spellings
            if _SRI.match(str(entry.get("hash", ""))) and _SHA256_HEX.match(str(entry["sha256"])):
                sri = "sha256-" + base64.b64encode(bytes.fromhex(entry["sha256"])).decode()
                _check(entry["hash"] == sri, path, f"{key}.hash", entry["hash"], f"is not sha256 in SRI form ({sri})")
        if "rev" in entry:
            _check(bool(_REV.match(str(entry["rev"]))), path, f"{key}.rev", entry["rev"], "not a 40-digit commit id")
        if "url" in entry:
            _check(
                str(entry["url"]).startswith("https://"),
                path,
                f"{key}.url",
                entry["url"],
                "only https URLs are allowed",
            )
        attrs = {k: v for k, v in entry.items() if k not in ("fetcher", "status", "provenance")}
        sources[name] = SourcePin(name, str(entry.get("fetcher")), str(status), str(entry.get("provenance", "")), attrs)
    models: dict[str, ModelPin] = {}
    for name, entry in data["models"].items():
        key = f"models.{name}"
        _check(
            bool(_SHA256_HEX.match(str(entry.get("sha256")))),
            path,
            f"{key}.sha256",
            entry.get("sha256"),
            "not 64 lowercase hex digits",
        )
        _check(
            isinstance(entry.get("size"), int) and entry["size"] > 0,
            path,
            f"{key}.size",
            entry.get("size"),
            "must be a positive integer",
        )
        status = entry.get("status")
        _check(status in STATUSES, path, f"{key}.status", status, f"must be one of {', '.join(STATUSES)}")
        synth = entry.get("synth")
        hf = entry.get("hf")
        if synth is None:
            _check(str(hf).startswith("hf://"), path, f"{key}.hf", hf, "must be an hf://OWNER/REPO/FILE@REV reference")
        else:
            _check(hf is None, path, f"{key}.hf", hf, "a synth model has no download reference")
        models[name] = ModelPin(
            name, entry.get("hf"), entry["sha256"], entry["size"], entry["status"], entry.get("provenance", ""), synth
        )
    return Pins(path, data, sources, models)


def load(path: Path | None = None) -> Pins:
    path = path or default_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CatalogSyntaxError(f"{path}:{exc.lineno}:{exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise CatalogSyntaxError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise CatalogSyntaxError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse(data, path)


@cache
def default() -> Pins:
    return load()
