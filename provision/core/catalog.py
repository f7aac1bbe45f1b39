"""The stack catalog (``provision/data/stacks.yaml``): typed, validated, pure.

Validation errors name the file, the key path and the offending value. A stack is a
value; rules such as "GPU requested on a stack without GPU -> E007" are functions here,
decided before any image is built or VM started.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from provision.core import layout
from provision.core import pins as pins_mod
from provision.core.errors import CatalogSyntaxError, GpuNotSupported, InvalidValue, UnknownRoute, UnknownStack

ROUTES = ("venus", "apir", "cpu")
GPU_ROUTES = ("venus", "apir")  # the routes a GPU guest (or a podman machine) runs on
HOSTS = ("darwin", "linux")
BASES = ("fedora", "debian")
MESA = ("copr", "distro", "none")

# Anything that reaches a Containerfile must be a plain token: no quotes, no expansions,
# no command separators, no newlines (templates interpolate it into RUN/ENV/LABEL lines).
_TOKEN = re.compile(r"^[A-Za-z0-9._+:/=@%,-]+$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_MODULE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
_UNSAFE = re.compile(r"[\n\r$`\"'\\;&|<>]")


def default_path() -> Path:
    return Path(str(resources.files("provision") / "data" / "stacks.yaml"))


@dataclass(frozen=True)
class Build:
    source: str
    cmake_flags: tuple[str, ...]
    targets: tuple[str, ...]
    packages: tuple[str, ...]
    patches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Boot:
    """What a stack that boots as a VM adds: the kernel + initrd packages, installed in a stage
    of their own, and the kernel modules the guest loads after the initrd (init's modprobe)."""

    packages: tuple[str, ...]
    modules: tuple[str, ...]


@dataclass(frozen=True)
class Stack:
    name: str
    description: str
    route: str
    hosts: tuple[str, ...]
    base: str
    gpu: bool
    gpu_vram_mib: int | None
    device: str | None
    mesa: str
    build: Build | None
    packages: tuple[str, ...]
    runtime_packages: tuple[str, ...]
    guest_env: dict[str, str] = field(default_factory=dict)
    verify: tuple[str, ...] = ()
    boot: Boot | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def needs_virtgpu_frontend(self) -> bool:
        return self.build is not None and any(f.startswith("-DGGML_VIRTGPU=ON") for f in self.build.cmake_flags)


@dataclass(frozen=True)
class Catalog:
    path: Path
    stacks: dict[str, Stack]

    def get(self, name: str) -> Stack:
        try:
            return self.stacks[name]
        except KeyError:
            from provision.core.suggest import did_you_mean

            hint = did_you_mean(name, self.stacks)
            raise UnknownStack(
                f"unknown stack {name!r} (known: {', '.join(sorted(self.stacks))})",
                fix=f"{hint} (`provision stacks` lists them)" if hint else "run `provision stacks` to list them",
            ) from None


def check_gpu(stack: Stack, gpu_requested: bool) -> None:
    """E007: asking for a GPU on a stack that has none fails before anything starts."""
    if gpu_requested and not stack.gpu:
        gpu_stacks = ", ".join(sorted(s for s in load().stacks if load().stacks[s].gpu))
        raise GpuNotSupported(
            f"stack {stack.name!r} has no GPU support",
            fix=f"drop --gpu, or use a stack with gpu: true ({gpu_stacks})",
        )


def check_route(stack: Stack, route: str | None) -> str:
    """The route a run uses: the stack's own unless an explicit one is asked for."""
    if route is None or route == stack.route:
        return stack.route
    raise UnknownRoute(f"stack {stack.name!r} serves route {stack.route!r}, not {route!r}")


class _Validator:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, value: object, why: str) -> InvalidValue:
        return InvalidValue(f"{self.path}: {key} = {value!r}: {why}")

    def mapping(self, value: object, key: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, value, "expected a mapping")
        for k in value:
            if k not in allowed:
                raise self.fail(f"{key}.{k}", value[k], f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for k in required:
            if k not in value:
                raise self.fail(f"{key}.{k}", None, "missing required key")
        return value

    def choice(self, value: object, key: str, choices: tuple[str, ...]) -> str:
        if value not in choices:
            raise self.fail(key, value, f"must be one of {', '.join(choices)}")
        return str(value)

    def text(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, value, "expected a non-empty string")
        if _UNSAFE.search(value):
            raise self.fail(key, value, "contains a newline, quote or shell metacharacter")
        return value

    def token(self, value: object, key: str) -> str:
        if not isinstance(value, str) or not _TOKEN.match(value):
            raise self.fail(
                key, value, "expected a plain token (letters, digits, ._+:/=@%,-), no spaces or shell metacharacters"
            )
        return value

    def tokens(self, value: object, key: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(key, value, "expected a list")
        return tuple(self.token(v, f"{key}[{i}]") for i, v in enumerate(value))

    def command(self, value: object, key: str) -> str:
        """A command run in the image (one RUN step): plain tokens separated by single spaces."""
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, value, "expected a command string")
        for tok in value.split(" "):
            if not _TOKEN.match(tok):
                raise self.fail(
                    key, value, f"token {tok!r} is not plain (no quotes, expansions or shell metacharacters)"
                )
        return value

    def boolean(self, value: object, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, value, "expected true or false")
        return value


_STACK_KEYS = {
    "description",
    "route",
    "hosts",
    "base",
    "gpu",
    "gpu_vram_mib",
    "device",
    "mesa",
    "build",
    "packages",
    "runtime_packages",
    "guest_env",
    "verify",
    "boot",
}
_BOOT_KEYS = {"packages", "modules"}
_BUILD_KEYS = {"source", "cmake_flags", "targets", "packages", "patches"}
_BUILD_REQUIRED = {"source", "cmake_flags", "targets", "packages"}


def _require_pinned(
    v: _Validator, pins: pins_mod.Pins, section: str, where: str, packages: tuple[str, ...] | list[str]
) -> None:
    """Every Debian package a stack names has its version in the pins (debian.<section>)."""
    pinned = pins.raw["debian"].get(section, {})
    for i, pkg in enumerate(packages):
        if pkg not in pinned:
            raise v.fail(f"{where}[{i}]", pkg, f"no version pinned under debian.{section} in {pins.path}")


def parse(data: Any, path: Path, pins: pins_mod.Pins | None = None) -> Catalog:
    v = _Validator(path)
    pins = pins or pins_mod.default()
    root = v.mapping(data, "<root>", {"stacks"}, {"stacks"})
    raw_stacks = v.mapping(root["stacks"], "stacks", set(root["stacks"] or {}), set())
    stacks: dict[str, Stack] = {}
    for name, raw in raw_stacks.items():
        key = f"stacks.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise v.fail(key, name, "stack names are lowercase letters, digits, '.' and '-'")
        s = v.mapping(raw, key, _STACK_KEYS, {"description", "route", "hosts", "base", "gpu", "mesa"})
        route = v.choice(s["route"], f"{key}.route", ROUTES)
        hosts_raw = s["hosts"]
        if not isinstance(hosts_raw, list) or not hosts_raw:
            raise v.fail(f"{key}.hosts", hosts_raw, "expected a non-empty list")
        hosts = tuple(v.choice(h, f"{key}.hosts[{i}]", HOSTS) for i, h in enumerate(hosts_raw))
        base = v.choice(s["base"], f"{key}.base", BASES)
        gpu = v.boolean(s["gpu"], f"{key}.gpu")
        vram = s.get("gpu_vram_mib")
        if gpu and (not isinstance(vram, int) or isinstance(vram, bool) or vram <= 0):
            raise v.fail(f"{key}.gpu_vram_mib", vram, "a GPU stack needs a positive integer")
        if not gpu and vram is not None:
            raise v.fail(f"{key}.gpu_vram_mib", vram, "only GPU stacks have VRAM")
        if gpu != (route != "cpu"):
            raise v.fail(f"{key}.gpu", gpu, f"route {route!r} implies gpu: {str(route != 'cpu').lower()}")
        device = s.get("device")
        if device is not None:
            device = v.text(device, f"{key}.device")
        mesa = v.choice(s["mesa"], f"{key}.mesa", MESA)
        if mesa == "copr" and base != "fedora":
            raise v.fail(f"{key}.mesa", mesa, "the COPR Mesa exists only for the fedora base")
        build = None
        if "build" in s:
            b = v.mapping(s["build"], f"{key}.build", _BUILD_KEYS, _BUILD_REQUIRED)
            source = v.token(b["source"], f"{key}.build.source")
            if source not in pins.sources:
                raise v.fail(f"{key}.build.source", source, f"not a source in {pins.path}")
            build = Build(
                source=source,
                cmake_flags=v.tokens(b["cmake_flags"], f"{key}.build.cmake_flags"),
                targets=v.tokens(b["targets"], f"{key}.build.targets"),
                packages=v.tokens(b["packages"], f"{key}.build.packages"),
                patches=v.tokens(b.get("patches", []), f"{key}.build.patches"),
            )
            for i, patch in enumerate(build.patches):
                if not (layout.patches_dir() / patch).is_file():
                    raise v.fail(f"{key}.build.patches[{i}]", patch, f"no such file under {layout.patches_dir()}")
            if base == "debian":
                _require_pinned(v, pins, "build_packages", f"{key}.build.packages", build.packages)
            for i, flag in enumerate(build.cmake_flags):
                if not flag.startswith("-D"):
                    raise v.fail(f"{key}.build.cmake_flags[{i}]", flag, "cmake flags must be -DNAME=VALUE")
        packages = v.tokens(s.get("packages", []), f"{key}.packages")
        if base == "debian":
            _require_pinned(v, pins, "guest_packages", f"{key}.packages", packages)
        boot = None
        if "boot" in s:
            if base != "debian":
                raise v.fail(f"{key}.boot", s["boot"], "only debian stacks boot as VMs")
            braw = v.mapping(s["boot"], f"{key}.boot", _BOOT_KEYS, _BOOT_KEYS)
            boot = Boot(
                v.tokens(braw["packages"], f"{key}.boot.packages"), v.tokens(braw["modules"], f"{key}.boot.modules")
            )
            _require_pinned(v, pins, "guest_packages", f"{key}.boot.packages", boot.packages)
            for i, mod in enumerate(boot.modules):
                if not _MODULE.match(mod):
                    raise v.fail(f"{key}.boot.modules[{i}]", mod, "a kernel module name (lowercase, digits, _ and -)")
        env_raw = s.get("guest_env") or {}
        if not isinstance(env_raw, dict):
            raise v.fail(f"{key}.guest_env", env_raw, "expected a mapping")
        guest_env: dict[str, str] = {}
        for ek, ev in env_raw.items():
            if not isinstance(ek, str) or not _ENV_KEY.match(ek):
                raise v.fail(f"{key}.guest_env.{ek}", ek, "environment names are UPPER_CASE")
            guest_env[ek] = v.token(ev, f"{key}.guest_env.{ek}")
        verify_raw = s.get("verify", [])
        if not isinstance(verify_raw, list):
            raise v.fail(f"{key}.verify", verify_raw, "expected a list of commands")
        verify = tuple(v.command(c, f"{key}.verify[{i}]") for i, c in enumerate(verify_raw))
        stacks[name] = Stack(
            name=name,
            description=v.text(s["description"], f"{key}.description"),
            route=route,
            hosts=hosts,
            base=base,
            gpu=gpu,
            gpu_vram_mib=vram,
            device=device,
            mesa=mesa,
            build=build,
            packages=packages,
            runtime_packages=v.tokens(s.get("runtime_packages", []), f"{key}.runtime_packages"),
            guest_env=guest_env,
            verify=verify,
            boot=boot,
        )
    return Catalog(path, stacks)


def load(path: Path | None = None, pins: pins_mod.Pins | None = None) -> Catalog:
    if path is None and pins is None:
        return _default()
    return _load(path or default_path(), pins)


def _load(path: Path, pins: pins_mod.Pins | None) -> Catalog:
    import yaml  # only where a catalog is read: `provision --help` should not pay for it

    try:
        # libyaml's loader when PyYAML has it: the same safe subset, several times faster
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise CatalogSyntaxError(f"{path}{where}: malformed YAML: {getattr(exc, 'problem', exc)}") from None
    except UnicodeDecodeError as exc:
        raise CatalogSyntaxError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise CatalogSyntaxError(
            f"{path}: cannot read: {exc.strerror or exc}", fix="point --catalog at a readable stacks YAML file"
        ) from None
    return parse(data, path, pins)


@cache
def _default() -> Catalog:
    return _load(default_path(), None)
