"""Every setting of provision, layered once into a frozen object that records where each value came from.

Layers, lowest first: built-in defaults -> the system file -> the user's file (XDG config dir)
-> the environment (``PROVISION_*``) -> flags (``provision --set KEY=VALUE``). Files are TOML
with top-level keys named as in ``SPECS`` (``accel = "tcg"``). ``provision/cli`` builds the
object once in ``main()`` (``load``) and hands it down; ``current()`` is what the library reads
(the object ``main`` installed, else one built from ``os.environ`` for library callers and
tests). The idea comes from cibuildwheel's ``options.py`` and RamaLama's layered config.

Pure apart from reading the two files it is given; nothing here writes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.core.errors import InvalidValue

SYSTEM_FILE = Path("/etc/krun-gpu/config.toml")
SYSTEM_FILE_ENV = "PROVISION_SYSTEM_CONFIG"  # where the system file is (relocated installs, tests)
USER_FILE_ENV = "PROVISION_CONFIG"  # the user's file instead of <XDG config dir>/krun-gpu/config.toml
APP = "krun-gpu"


XDG = {"cache": ("XDG_CACHE_HOME", ".cache"), "state": ("XDG_STATE_HOME", ".local/state"),
       "config": ("XDG_CONFIG_HOME", ".config")}  # fmt: skip


def user_dir(kind: str, env: Mapping[str, str] | None = None) -> str:
    """The user's cache/state/config directory for krun-gpu: the XDG base directories off macOS
    (what platformdirs answers there, without its import on every command), platformdirs on macOS."""
    env = os.environ if env is None else env
    if sys.platform != "darwin":
        var, fallback = XDG[kind]
        base = env.get(var, "").strip()
        return str(Path(base if base else Path.home() / fallback) / APP)
    import platformdirs

    return str(getattr(platformdirs, f"user_{kind}_dir")(APP))


def _platformdir(kind: str) -> Callable[[], str]:
    return lambda: user_dir(kind)


def _positive_int(raw: str) -> str | None:
    return None if raw.isdigit() and int(raw) >= 1 else "a positive integer"


def _seconds(raw: str) -> str | None:
    try:
        ok = 0 < float(raw) <= 3600
    except ValueError:
        ok = False
    return None if ok else "seconds above 0 and at most 3600"


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda raw: None if raw in choices else "one of " + ", ".join(choices)


def _path(raw: str) -> str | None:
    return "a path (no NUL byte)" if "\0" in raw or not raw.strip() else None


def _size(raw: str) -> str | None:
    import re

    ok = re.fullmatch(r"\d+(?:\.\d+)?\s*[KMGT]?(?:i?B)?", raw.strip(), re.I)
    return None if ok else "a size such as 512M or 2G"


def _host(raw: str) -> str | None:
    import re

    return None if re.fullmatch(r"[A-Za-z0-9.\-\[\]:/]{1,255}", raw) else "a registry host[:port]"


@dataclass(frozen=True)
class Spec:
    key: str
    env: str
    default: str | Callable[[], str] | None  # None: decided where it is used (``default_note`` says how)
    check: Callable[[str], str | None]  # what a good value is, or None when ``raw`` is good
    help: str
    default_note: str = ""


SPECS: tuple[Spec, ...] = (
    Spec("cache", "PROVISION_CACHE", _platformdir("cache"), _path, "root of every cache (core/paths.py LAYOUT)"),
    Spec("state", "PROVISION_STATE", _platformdir("state"), _path, "machine routes and per-invocation logs"),
    Spec("data_root", "PROVISION_DATA_ROOT", lambda: str(Path(__file__).resolve().parents[2]), _path,
         "where containerfiles/ and patches/ are (a relocated install)"),
    Spec("host_tools", "PROVISION_HOST_TOOLS", None, _path, "QEMU + virglrenderer chroot (or / for the host's)",
         "search: cached chroot, installed bundle, host PATH"),
    Spec("accel", "PROVISION_ACCEL", None, _one_of("kvm", "tcg"), "Linux guest accelerator",
         "kvm when usable, else tcg"),
    Spec("gpu_slots", "PROVISION_GPU_SLOTS", "2", _positive_int, "GPU guests at once on this host"),
    Spec("guest_debug", "PROVISION_GUEST_DEBUG", "0", _one_of("0", "1"), "1: the guest kernel's console on stderr"),
    Spec("stall_s", "PROVISION_STALL_S", "20", _seconds, "a model pull retries after this long without a byte"),
    Spec("podman_isolation", "PROVISION_PODMAN_ISOLATION", None, _one_of("chroot", "oci", "rootless"),
         "podman build --isolation", "decided from the host: chroot inside a container"),
    Spec("ask_above", "PROVISION_ASK_ABOVE", "2G", _size, "an interactive model pull asks before more than this"),
    Spec("shortnames", "PROVISION_SHORTNAMES", None, _path, "your model shortnames file",
         "shortnames.conf in the user config directory"),
    Spec("ollama_registry", "PROVISION_OLLAMA_REGISTRY", None, _host, "registry for ollama:// and NAME:TAG",
         "none: name one here or in the reference"),
    Spec("docker_registry", "PROVISION_DOCKER_REGISTRY", None, _host, "registry for docker://REPO:TAG",
         "none: name one here or in the reference"),
)
BY_KEY = {s.key: s for s in SPECS}


@dataclass(frozen=True)
class Value:
    key: str
    value: str | None
    source: str  # "default", "system file PATH", "user file PATH", "environment PROVISION_X", "flag --set"


@dataclass(frozen=True)
class Settings:
    values: Mapping[str, Value]
    files: tuple[tuple[str, Path, bool], ...] = ()  # (layer, path, was it there)

    def get(self, key: str) -> str | None:
        return self.values[key].value

    def source(self, key: str) -> str:
        return self.values[key].source

    def path(self, key: str) -> Path | None:
        raw = self.get(key)
        return Path(raw).expanduser() if raw else None

    @property
    def cache(self) -> Path:
        return self.path("cache") or Path(".")

    @property
    def state(self) -> Path:
        return self.path("state") or Path(".")

    @property
    def gpu_slots(self) -> int:
        return int(self.get("gpu_slots") or 2)

    def rows(self) -> list[dict[str, Any]]:
        """Every setting, with its value, where it came from and what it is for (config show, doctor)."""
        out = []
        for spec in SPECS:
            v = self.values[spec.key]
            shown = v.value if v.value is not None else f"({spec.default_note})"
            out.append({"key": spec.key, "value": shown, "source": v.source, "env": spec.env, "help": spec.help})
        return out

    def environ(self) -> dict[str, str]:
        """The values that came from a file or a flag, as the ``PROVISION_*`` variables they stand for,
        for the modules that still read the environment (and for the children they start)."""
        return {BY_KEY[k].env: v.value for k, v in self.values.items()
                if v.value is not None and not v.source.startswith(("default", "environment"))}  # fmt: skip


def _check(spec: Spec, raw: str, where: str) -> str:
    why = spec.check(raw)
    if why is not None:
        raise InvalidValue(f"{where}: {spec.key} = {raw!r}: expected {why}",
                           fix=f"set {spec.key} in {where} to {why}, or remove it")  # fmt: skip
    return raw


def read_file(path: Path, layer: str) -> dict[str, str]:
    """One TOML layer: every key known, every value a string, number or boolean."""
    import tomllib  # only when a config file exists

    where = f"{layer} {path}"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidValue(f"{where}: cannot be read: {exc}", fix=f"make {path} a readable UTF-8 file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidValue(f"{where}: not valid TOML: {exc}", fix=f"repair {path} (TOML, `key = \"value\"`)") from None
    out: dict[str, str] = {}
    for key, raw in data.items():
        spec = BY_KEY.get(key)
        if spec is None:
            raise InvalidValue(f"{where}: unknown key {key!r}",
                               fix=f"remove {key} from {path}; known keys: {', '.join(BY_KEY)}")  # fmt: skip
        if isinstance(raw, bool):
            raw = "1" if raw else "0"
        if not isinstance(raw, str | int | float):
            raise InvalidValue(f"{where}: {key} is a {type(raw).__name__}", fix=f"give {key} a string or number")
        out[key] = _check(spec, str(raw), where)
    return out


def parse_flags(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or key not in BY_KEY:
            raise InvalidValue(f"--set {pair!r}: expected KEY=VALUE with KEY one of {', '.join(BY_KEY)}",
                               fix="e.g. --set accel=tcg")  # fmt: skip
        out[key] = _check(BY_KEY[key], raw, "--set")
    return out


def user_file(env: Mapping[str, str]) -> Path:
    if env.get(USER_FILE_ENV):
        return Path(env[USER_FILE_ENV]).expanduser()
    return Path(user_dir("config", env)) / "config.toml"


def load(env: Mapping[str, str] | None = None, flags: Sequence[str] = (),
         system: Path | None = None, user: Path | None = None) -> Settings:  # fmt: skip
    """The layered settings: defaults -> system file -> user file -> environment -> flags."""
    env = os.environ if env is None else env
    system = system or Path(env.get(SYSTEM_FILE_ENV) or SYSTEM_FILE)
    user = user or user_file(env)
    layers: list[tuple[str, dict[str, str]]] = []
    files = []
    for layer, path in (("system file", system), ("user file", user)):
        there = path.is_file()
        files.append((layer, path, there))
        if there:
            layers.append((f"{layer} {path}", read_file(path, layer)))
    environment = {}
    for spec in SPECS:
        if env.get(spec.env):
            environment[spec.key] = _check(spec, env[spec.env], f"environment {spec.env}")
    flag_values = parse_flags(flags)
    values: dict[str, Value] = {}
    for spec in SPECS:
        default = spec.default() if callable(spec.default) else spec.default
        values[spec.key] = Value(spec.key, default, "default")
        for source, layer_values in layers:
            if spec.key in layer_values:
                values[spec.key] = Value(spec.key, layer_values[spec.key], source)
        if spec.key in environment:
            values[spec.key] = Value(spec.key, environment[spec.key], f"environment {spec.env}")
        if spec.key in flag_values:
            values[spec.key] = Value(spec.key, flag_values[spec.key], f"flag --set {spec.key}")
    return Settings(values, tuple(files))


_installed: list[Settings] = []


def current() -> Settings:
    """The settings ``main()`` built for this command; outside a command, the environment's now."""
    return _installed[-1] if _installed else load()


@contextmanager
def installed(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` what ``current()`` returns for the length of one command."""
    _installed.append(settings)
    try:
        yield settings
    finally:
        _installed.pop()
