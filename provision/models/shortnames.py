"""Short names for references: ours (provision/data/shortnames.conf) and the user's file over them.

The user's file is the setting ``shortnames`` (default ``shortnames.conf`` in the user config
directory). Both are TOML with ``[shortnames]`` (NAME = REFERENCE) and ``[registries]``
(TRANSPORT = HOST: where a reference without a registry goes). A value is checked when read: a
short name may not point at another short name, and a bad file is E003 naming the file and key.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.core import settings
from provision.core.errors import InvalidValue

SHIPPED = Path(__file__).resolve().parents[1] / "data" / "shortnames.conf"
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$")
_VALUE = re.compile(r"^[^\s\x00-\x1f\x7f]{1,1000}$")
_REGISTRY = re.compile(r"^[A-Za-z0-9.\-\[\]:/]{1,255}$")
REGISTRY_SETTING = {"ollama": "ollama_registry", "docker": "docker_registry"}  # transport -> its setting


@dataclass(frozen=True)
class Shortname:
    name: str
    reference: str
    origin: Path


def user_file(given: settings.Settings | None = None) -> Path:
    """The setting shortnames (default: shortnames.conf in the user config directory)."""
    return (given or settings.current()).typed.shortnames


def _read(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        why = f"{path}: not a readable TOML shortnames file ({exc})"
        raise InvalidValue(why, fix=f"repair or remove {path}") from None
    for table in data:
        if table not in ("shortnames", "registries") or not isinstance(data[table], dict):
            raise InvalidValue(f"{path}: [{table}] is not a table this file takes", fix=f"{path}: keep [shortnames] "
                               "and [registries] only")  # fmt: skip
    return data


def _files() -> list[Path]:
    return [SHIPPED, user_file()]


def table() -> dict[str, Shortname]:
    """Every short name, the user's over ours."""
    out: dict[str, Shortname] = {}
    for path in _files():
        for key, value in _read(path).get("shortnames", {}).items():
            if not _KEY.match(key) or not isinstance(value, str) or not _VALUE.match(value):
                raise InvalidValue(
                    f"{path}: shortnames.{key!r} = {value!r} is not NAME = \"REFERENCE\" (no spaces)",
                    fix=f'{path}: write e.g. "llama3.2:1b" = "ollama://library/llama3.2:1b"',
                )
            out[key] = Shortname(key, value, path)
    for entry in out.values():
        if entry.reference in out:
            raise InvalidValue(
                f"{entry.origin}: shortnames.{entry.name!r} points at another short name ({entry.reference!r})",
                fix=f"{entry.origin}: write the full reference for {entry.name!r}",
            )
    return out


def expand(reference: str) -> str:
    found = table().get(reference)
    return found.reference if found else reference


def registry(transport: str, given: settings.Settings | None = None) -> str:
    """The registry for a reference of ``transport`` that names none: the setting (ollama_registry,
    docker_registry), the user's shortnames file, ours."""
    key = REGISTRY_SETTING.get(transport)
    s = given or settings.current()
    value: Any = s.get(key) if key else None
    where = s.shown(key) if key and value else ""
    if not value:
        for path in reversed(_files()):
            value = _read(path).get("registries", {}).get(transport)
            if value is not None:
                where = f"{path} registries.{transport}"
                break
    if not isinstance(value, str) or not _REGISTRY.match(value):
        # A value that is there but unusable is shown where it was read; a missing one is said in words.
        if value is None or not where:
            what = "none is set"
        elif key and where == s.shown(key):
            what = f"{where}: not HOST[:PORT] or a base URL"
        else:
            what = f"{where} = {str(value)!r}: not HOST[:PORT] or a base URL"
        raise InvalidValue(
            f"no usable default registry for {transport}:// ({what})",
            fix=f"name the registry in the reference ({transport}://HOST/REPO:TAG)"
            + (f", or set {settings.BY_KEY[key].env}=HOST (or {key} in the config file)" if key else ""),
        )
    return value
