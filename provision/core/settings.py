"""Every setting of provision, layered once into a frozen object that records where each value came from.

Layers, lowest first: built-in defaults -> the system file -> the user's file (XDG config dir)
-> the environment (``PROVISION_*``) -> flags (``provision --set KEY=VALUE``). Files are TOML
with top-level keys named as in ``SPECS`` (``accel = "tcg"``). ``provision/cli`` builds the
object once in ``main()`` (``load``) and hands it down (``core/app.py``); ``Settings.typed`` is
each value as its Python type (``Values``). A function below the CLI takes the settings from its
caller; ``current()`` is only its fallback when the caller has none to hand (the object ``main``
installed for this one command, else one built from ``os.environ`` as it is now, for library
callers and tests): tests/test_architecture.py holds that edge. This is the only module that
reads a ``PROVISION_*`` variable (tests/core/test_settings_everywhere.py holds that line). The
idea comes from cibuildwheel's ``options.py`` and RamaLama's layered config.

Pure apart from reading the two files it is given; nothing here writes.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

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


_SIZE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:i?B)?$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX_SECONDS = 3600.0


def _positive_int(raw: str) -> str | None:
    return None if raw.isdigit() and int(raw) >= 1 else "a positive integer"


def _seconds(raw: str) -> str | None:
    try:
        ok = 0 < float(raw) <= MAX_SECONDS
    except ValueError:
        ok = False
    return None if ok else f"seconds above 0 and at most {MAX_SECONDS:g}"


def _one_of(*choices: str) -> Callable[[str], str | None]:
    return lambda raw: None if raw in choices else "one of " + ", ".join(choices)


def _path(raw: str) -> str | None:
    return "a path (no NUL byte)" if "\0" in raw or not raw.strip() else None


def _size(raw: str) -> str | None:
    return None if _SIZE.match(raw.strip()) else "a size such as 512M or 2G (0: always)"


def _host(raw: str) -> str | None:
    return None if re.fullmatch(r"[A-Za-z0-9.\-\[\]:/]{1,255}", raw) else "a registry host[:port]"


def parse_size(raw: str) -> int:
    """Bytes of a size such as 512M, 2G or 1.5GiB (checked by ``_size``)."""
    m = _SIZE.match(raw.strip())
    if m is None:
        raise ValueError(raw)
    return int(float(m["n"]) * _UNITS[m["unit"].upper()])


@dataclass(frozen=True)
class Kind:
    """A setting's type: its name (shown by config show), what a good value is, its Python value
    (``python``: the type of ``Values``' field, which tests hold against every Spec's kind)."""

    name: str
    check: Callable[[str], str | None]  # None when ``raw`` is good, else what a good value is
    parse: Callable[[str], Any] = str
    python: type = str


PATH = Kind("path", _path, lambda raw: Path(raw).expanduser(), Path)
COUNT = Kind("integer >= 1", _positive_int, int, int)
SECONDS = Kind("seconds", _seconds, float, float)
SIZE = Kind("size", _size, parse_size, int)
SWITCH = Kind("0 or 1", _one_of("0", "1"), lambda raw: raw == "1", bool)
HOST = Kind("host[:port]", _host)


def choice(*choices: str) -> Kind:
    return Kind("/".join(choices), _one_of(*choices))


@dataclass(frozen=True)
class Spec:
    key: str
    env: str
    default: str | Callable[[], str] | None  # None: decided where it is used (``default_note`` says how)
    kind: Kind
    help: str
    default_note: str = ""  # how the default is decided, where it is not one fixed value
    example: str = ""  # a good value, for the fix of a bad one

    def default_text(self) -> str:
        """The default as the README's table and `config show` describe it."""
        return self.default if isinstance(self.default, str) else self.default_note

    @property
    def check(self) -> Callable[[str], str | None]:
        return self.kind.check


def _shortnames_default() -> str:
    return str(Path(user_dir("config")) / "shortnames.conf")


SPECS: tuple[Spec, ...] = (
    Spec("cache", "PROVISION_CACHE", _platformdir("cache"), PATH, "root of every cache (core/paths.py LAYOUT)",
         "the user cache directory (XDG_CACHE_HOME)/krun-gpu", example="/var/cache/krun-gpu"),
    Spec("state", "PROVISION_STATE", _platformdir("state"), PATH, "machine routes and per-invocation logs",
         "the user state directory (XDG_STATE_HOME)/krun-gpu", example="/var/lib/krun-gpu"),
    Spec("data_root", "PROVISION_DATA_ROOT", lambda: str(Path(__file__).resolve().parents[2]), PATH,
         "where containerfiles/ and patches/ are (a relocated install)", "beside the provision package",
         example="/usr/share/krun-gpu"),
    Spec("host_tools", "PROVISION_HOST_TOOLS", None, PATH, "QEMU + virglrenderer chroot or bundle (or / for the "
         "host's)", "search: cached chroot, installed bundle, host PATH", example="/"),
    Spec("accel", "PROVISION_ACCEL", None, choice("kvm", "tcg"), "Linux guest accelerator",
         "kvm when usable, else tcg", example="tcg"),
    Spec("gpu_slots", "PROVISION_GPU_SLOTS", "2", COUNT, "GPU guests at once on this host", example="2"),
    Spec("guest_debug", "PROVISION_GUEST_DEBUG", "0", SWITCH, "1: the guest kernel's console on stderr",
         example="1"),
    Spec("apir_host_ggml", "PROVISION_APIR_HOST_GGML", None, PATH,
         "APIR on a bundle's host: the bin/ of its own `provision ggml build`",
         "the host-tools chroot's ggml build", example="/srv/ggml-cuda/bin"),
    Spec("stall_s", "PROVISION_STALL_S", "20", SECONDS, "a model pull retries after this long without a byte",
         example="20"),
    Spec("podman_isolation", "PROVISION_PODMAN_ISOLATION", None, choice("chroot", "oci", "rootless"),
         "podman build --isolation", "decided from the host: chroot inside a container", example="oci"),
    Spec("ask_above", "PROVISION_ASK_ABOVE", "2G", SIZE, "an interactive model pull asks before more than this",
         example="4G"),
    Spec("ask_builds", "PROVISION_ASK_BUILDS", "1", SWITCH, "on a terminal, ask before a build the command "
         "needs but was not named for (0: never ask)", example="0"),
    Spec("shortnames", "PROVISION_SHORTNAMES", _shortnames_default, PATH, "your model shortnames file",
         "shortnames.conf in the user config directory", example="~/shortnames.conf"),
    Spec("ollama_registry", "PROVISION_OLLAMA_REGISTRY", None, HOST, "registry for ollama:// and NAME:TAG",
         "the shortnames files' [registries]", example="registry.example:5000"),
    Spec("docker_registry", "PROVISION_DOCKER_REGISTRY", None, HOST, "registry for docker://REPO:TAG",
         "the shortnames files' [registries]", example="registry.example:5000"),
)
BY_KEY = {s.key: s for s in SPECS}


@dataclass(frozen=True)
class Values:
    """Every setting as its Python value: one typed field per Spec, in SPECS' order (None: unset,
    decided where it is used). Made from SPECS by ``values_of``; the field list is written out so
    mypy checks each use, and tests/core/test_settings.py holds it equal to SPECS, kinds included."""

    cache: Path
    state: Path
    data_root: Path
    host_tools: Path | None
    accel: Literal["kvm", "tcg"] | None
    gpu_slots: int
    guest_debug: bool
    apir_host_ggml: Path | None
    stall_s: float
    podman_isolation: Literal["chroot", "oci", "rootless"] | None
    ask_above: int
    ask_builds: bool
    shortnames: Path
    ollama_registry: str | None
    docker_registry: str | None


def values_of(raw: Mapping[str, str | None]) -> Values:
    """Each Spec's raw string parsed by its kind (every raw value was checked when it was read)."""
    parsed: dict[str, Any] = {s.key: None if raw.get(s.key) is None else s.kind.parse(str(raw[s.key])) for s in SPECS}
    return Values(**parsed)


VALUE_FIELDS = tuple(f.name for f in fields(Values))


@dataclass(frozen=True)
class Value:
    key: str
    value: str | None
    source: str  # "default", "system file PATH", "user file PATH", "environment PROVISION_X", "flag --set"


@dataclass(frozen=True)
class Settings:
    """The layered settings of one command: ``typed`` holds each value as its Python value (what
    code reads), ``values`` each raw value with where it came from (what messages and ``config
    show`` say)."""

    values: Mapping[str, Value]
    typed: Values
    files: tuple[tuple[str, Path, bool], ...] = ()  # (layer, path, was it there)

    def get(self, key: str) -> str | None:
        return self.values[key].value

    def source(self, key: str) -> str:
        return self.values[key].source

    def shown(self, key: str) -> str:
        """The value as the place it came from spells it, for a message: ``PROVISION_ACCEL=tcg``,
        ``--set accel=tcg``, ``accel = "tcg" (user file PATH)``, ``accel = "tcg" (default)``."""
        v, spec = self.values[key], BY_KEY[key]
        if v.source.startswith("environment"):
            return f"{spec.env}={shlex.quote(v.value or '')}"
        if v.source.startswith("flag"):
            return f"--set {key}={shlex.quote(v.value or '')}"
        return f'{key} = "{v.value}" ({v.source})' if v.value is not None else f"{key} unset ({spec.default_note})"

    def unset_hint(self, key: str) -> str:
        """How to take this value away again, where it came from (the fix of a message about it)."""
        v, spec = self.values[key], BY_KEY[key]
        if v.source.startswith("environment"):
            return f"unset {spec.env}"
        if v.source.startswith("flag"):
            return f"drop --set {key}"
        if v.source.startswith(("system file", "user file")):
            return f"remove {key} from {v.source.split(' ', 2)[2]}"
        return f"set {spec.env} (or {key} in the config file)"

    def rows(self) -> list[dict[str, Any]]:
        """Every setting, with its value, where it came from and what it is for (config show, doctor)."""
        out = []
        for spec in SPECS:
            v = self.values[spec.key]
            shown = v.value if v.value is not None else f"({spec.default_note})"
            out.append({"key": spec.key, "value": shown, "source": v.source, "env": spec.env,
                        "type": spec.kind.name, "help": spec.help})  # fmt: skip
        return out

    def environ(self) -> dict[str, str]:
        """The values that came from a file or a flag, as the ``PROVISION_*`` variables they stand
        for: the environment of the programs a command starts (provision's own children read them)."""
        return {BY_KEY[k].env: v.value for k, v in self.values.items()
                if v.value is not None and not v.source.startswith(("default", "environment"))}  # fmt: skip


def default_of(key: str) -> str:
    """A setting's built-in default (for the modules that keep it as a constant too)."""
    default = BY_KEY[key].default
    value = default() if callable(default) else default
    if value is None:
        raise AssertionError(f"setting {key} has no fixed default ({BY_KEY[key].default_note})")
    return value


def _check(spec: Spec, raw: str, where: str) -> str:
    """``raw`` when it is a good value of ``spec``, else E003 naming where it was, the key and the value."""
    why = spec.check(raw)
    if why is None:
        return raw
    example = spec.example or "VALUE"
    if where.startswith("environment"):
        fix = f"set {spec.env} to {why} (e.g. {spec.env}={shlex.quote(example)}), or unset it"
    elif where == "--set":
        fix = f"give {spec.key} {why} (e.g. --set {spec.key}={shlex.quote(example)}), or drop it"
    else:
        fix = f'in {where}, set {spec.key} to {why} (e.g. {spec.key} = "{example}"), or remove it'
    raise InvalidValue(f"{where}: {spec.key} = {raw!r}: expected {why}", fix=fix)


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
    return Settings(values, values_of({k: v.value for k, v in values.items()}), tuple(files))


_installed: list[Settings] = []


def current() -> Settings:
    """The settings ``main()`` built for this command; outside a command, the environment's now
    (built afresh on each call, so a test's ``monkeypatch.setenv`` counts at once)."""
    return _installed[-1] if _installed else load()


@contextmanager
def installed(settings: Settings) -> Iterator[Settings]:
    """Make ``settings`` what ``current()`` returns for the length of one command."""
    _installed.append(settings)
    try:
        yield settings
    finally:
        _installed.pop()
