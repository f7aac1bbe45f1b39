"""Catalog + pins -> Containerfile text. Pure: same inputs, byte-identical output.

Every value that reaches a template is checked twice: by name here (so the error names
the pins/catalog key) and by the template environment's finalize hook (a backstop for any
value a template adds later).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from provision import __version__
from provision.core import catalog, layout
from provision.core import pins as pins_mod
from provision.core.errors import InvalidValue

_UNSAFE = re.compile(r"[\n\r$`\"'\\;&|<>]")
_PLAIN = re.compile(r"^[A-Za-z0-9._+:/=@%,~-]+$")

# Flags every source build gets: portable code (the image runs on other CPUs than the
# builder, and TCG cannot run AVX-512), no network-using extras, no test/example targets.
COMMON_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
)
OFFLINE_CMAKE_INCLUDE = "ggml-virtgpu-offline.cmake"


@dataclass(frozen=True)
class Input:
    """A file copied into the build context, checked by sha256 inside the build."""

    name: str
    sha256: str


@dataclass(frozen=True)
class ModelInput:
    name: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Rendered:
    stack: str
    template: str
    containerfile: str
    files: dict[str, str]
    inputs: tuple[Input, ...]
    labels: dict[str, str] = field(default_factory=dict)

    def write(self, out_dir: Path) -> list[Path]:
        """Write the Containerfile and generated files (not the inputs) atomically."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in {"Containerfile": self.containerfile, **self.files}.items():
            target = out_dir / name
            tmp = target.with_name(f".{name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(target)
            written.append(target)
        return written


def _plain(value: object, key: str, source: Path) -> str:
    if not isinstance(value, str) or not _PLAIN.match(value):
        raise InvalidValue(
            f"{source}: {key} = {value!r}: not a plain token (no spaces, quotes or shell metacharacters)"
        )
    return value


def _finalize(value: Any) -> Any:
    if isinstance(value, str) and _UNSAFE.search(value):
        raise InvalidValue(f"template value {value!r} carries a newline, quote or shell metacharacter")
    return value


def environment(templates: Path | None = None) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates or layout.templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_finalize,
    )


def sdist_unpacked_dir(filename: str) -> str:
    return filename.removesuffix(".tar.gz")


def sha256sums(entries: list[tuple[str, str]]) -> str:
    return "".join(f"{digest}  {name}\n" for name, digest in entries)


def merge_cmake_flags(common: tuple[str, ...], own: tuple[str, ...]) -> list[str]:
    """Common flags first; a stack's own -DNAME=... replaces a common one of the same NAME."""
    names = {f.split("=", 1)[0] for f in own}
    return [f for f in common if f.split("=", 1)[0] not in names] + list(own)


def template_for(stack: catalog.Stack) -> str:
    if stack.base == "fedora":
        return "fedora-source.containerfile.j2"
    return "debian-source.containerfile.j2" if stack.build is not None else "debian-packages.containerfile.j2"


def patch_input_name(patch: str) -> str:
    """Patches are copied flat into the context; names are unique within patches/."""
    return Path(patch).name


def render(
    stack: catalog.Stack,
    pins: pins_mod.Pins,
    *,
    base_image: str | None = None,
    local_inputs: dict[str, str] | None = None,
    model: ModelInput | None = None,
    templates: Path | None = None,
) -> Rendered:
    """Render one stack. ``local_inputs`` maps our own context files (CMake include,
    patches) to their sha256; the sdist's hash comes from the pins."""
    local_inputs = dict(local_inputs or {})
    labels: dict[str, str] = {
        "org.opencontainers.image.title": f"krun-gpu-{stack.name}",
        "org.opencontainers.image.description": stack.description,
        "org.opencontainers.image.version": __version__,
        "org.opencontainers.image.vendor": "krun-gpu",
        "krun-gpu.stack": stack.name,
        "krun-gpu.route": stack.route,
        "krun-gpu.gpu": "true" if stack.gpu else "false",
    }
    if stack.gpu_vram_mib:
        labels["krun-gpu.gpu-vram-mib"] = str(stack.gpu_vram_mib)
    if stack.device:
        labels["krun-gpu.device"] = stack.device
    context: dict[str, Any] = {"stack": stack, "model": model, "verify": list(stack.verify)}
    files: dict[str, str] = {}
    inputs: list[Input] = []

    def local(name: str) -> Input:
        if name not in local_inputs:
            raise InvalidValue(f"stacks.{stack.name}: {name} must be provided as a build input")
        return Input(name, local_inputs[name])

    if stack.build is not None:
        src = pins.source(stack.build.source)
        sdist = {
            "filename": _plain(src["filename"], f"sources.{src.name}.filename", pins.path),
            "unpacked_dir": sdist_unpacked_dir(src["filename"]),
            "vendored_tree": _plain(src["vendored_tree"], f"sources.{src.name}.vendored_tree", pins.path),
        }
        inputs.append(Input(sdist["filename"], src["sha256"]))
        flags = merge_cmake_flags(COMMON_CMAKE_FLAGS, stack.build.cmake_flags)
        if stack.needs_virtgpu_frontend:
            inputs.append(local(OFFLINE_CMAKE_INCLUDE))
            flags.append(f"-DCMAKE_PROJECT_INCLUDE=/src/{OFFLINE_CMAKE_INCLUDE}")
            proto = pins.source("llama-cpp").get("apir_protocol")
            if proto:
                labels["krun-gpu.apir.protocol"] = f"{proto['major']}.{proto['minor']}"
        patch_files = [patch_input_name(p) for p in stack.build.patches]
        inputs.extend(local(name) for name in patch_files)
        labels[f"krun-gpu.pin.{src.name}.version"] = str(src["version"])
        labels[f"krun-gpu.pin.{src.name}.sha256"] = src["sha256"]
        labels["krun-gpu.pin.llama-cpp.rev"] = str(src["vendored_rev"])
        if patch_files:
            labels["krun-gpu.patches"] = ",".join(patch_files)
        files["SHA256SUMS"] = sha256sums([(i.name, i.sha256) for i in inputs])
        context.update(sdist=sdist, inputs=list(inputs), cmake_flags=flags, patch_files=patch_files)

    if stack.base == "fedora":
        fedora = pins.fedora
        for k in ("image", "copr", "mesa_vulkan_drivers"):
            _plain(fedora.get(k), f"fedora.{k}", pins.path)
        if stack.build is None:
            raise InvalidValue(f"stacks.{stack.name}: the fedora template builds from source and needs a build section")
        labels["org.opencontainers.image.base.name"] = fedora["image"]
        if stack.mesa == "copr":
            labels["krun-gpu.pin.fedora.copr"] = fedora["copr"]
            labels["krun-gpu.pin.fedora.mesa-vulkan-drivers"] = fedora["mesa_vulkan_drivers"]
        context.update(fedora=fedora)
    else:
        if not base_image:
            raise InvalidValue(f"stacks.{stack.name}: the debian template needs a local base image")
        _plain(base_image, "base_image", pins.path)
        versions = pins.debian_packages(purpose=f"stack {stack.name}")
        packages = []
        for pkg in stack.packages:
            version = _plain(versions[pkg], f"debian.guest_packages.{pkg}", pins.path)
            packages.append(f"{pkg}={version}")
            labels[f"krun-gpu.pin.debian.{pkg}"] = version
        build_packages = []
        if stack.build is not None:
            build_versions = pins.debian.get("build_packages", {})
            for pkg in stack.build.packages:
                version = _plain(build_versions.get(pkg), f"debian.build_packages.{pkg}", pins.path)
                build_packages.append(f"{pkg}={version}")
        labels["org.opencontainers.image.base.name"] = base_image
        labels["krun-gpu.pin.debian.suite"] = pins.debian["suite"]
        context.update(base_image=base_image, packages=packages, build_packages=build_packages)

    if model is not None:
        _plain(model.filename, "model.filename", pins.path)
        files["SHA256SUMS.model"] = sha256sums([(model.filename, model.sha256)])
        inputs.append(Input(model.filename, model.sha256))
        labels[f"krun-gpu.model.{model.name}.sha256"] = model.sha256
        labels["krun-gpu.model.path"] = f"/opt/models/{model.filename}"

    context["env"] = sorted(stack.guest_env.items())
    context["labels"] = list(labels.items())
    template = template_for(stack)
    try:
        text = environment(templates).get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise InvalidValue(f"containerfiles/{template}: {exc.message}") from None
    return Rendered(stack.name, template, text, files, tuple(inputs), labels)
