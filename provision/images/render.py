"""Catalog + pins -> Containerfile text. Pure: same inputs, byte-identical output.

A stack renders as package stages (``Containerfile.packages-<stage>``: one FROM and the
package manager's install, the only builds with the network on) and the ``Containerfile``
proper, which starts FROM those images and is built with the network off.

Every value that reaches a template is checked twice: by name here (so the error names
the pins/catalog key) and by the template environment's finalize hook (a backstop for any
value a template adds later).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from provision import __version__
from provision.core import catalog, layout, outputs
from provision.core import pins as pins_mod
from provision.core.errors import InvalidValue
from provision.images import fedora_pins

_UNSAFE = re.compile(r"[\n\r$`\"'\\;&|<>]")
_PLAIN = re.compile(r"^[A-Za-z0-9._+:/=@%,~-]+$")

# Flags every source build gets: portable code (the image runs on other CPUs than the
# builder, and TCG cannot run AVX-512), no network-using extras, no test/example targets.
# The web UI is off: with LLAMA_USE_PREBUILT_UI on (the default) llama-server and llama-cli
# depend on a target that downloads an unpinned UI archive; off, llama-server still serves its
# API (docs/images.md, "The web UI").
COMMON_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
# Upstream release builds print the commit abbreviated to 9 digits (b<number>-<commit>).
SHORT_REV = 9
PACKAGE_IMAGE_REPO = "localhost/krun-gpu-packages"
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
class PackageStage:
    """A package stage: its Containerfile (in ``Rendered.files``) and the local image it makes."""

    stage: str
    file: str
    ref: str


@dataclass(frozen=True)
class Rendered:
    stack: str
    template: str
    containerfile: str
    files: dict[str, str]
    inputs: tuple[Input, ...]
    labels: dict[str, str] = field(default_factory=dict)
    package_stages: tuple[PackageStage, ...] = ()

    def write(self, out_dir: Path, *, force: bool = False, flag: str = "--output") -> list[Path]:
        """Write the Containerfile and generated files (not the inputs), each whole or not at all.

        Files provision rendered before (the Containerfile's first line says so; the checksum
        files beside such a Containerfile) are replaced; anything else only with ``force``.
        Every target is checked before the first is written.
        """
        if out_dir.exists() and not out_dir.is_dir():
            raise InvalidValue(f"{flag} {out_dir} is a file, not a directory", fix=f"name a directory with {flag}")
        wanted = {"Containerfile": self.containerfile, **self.files}
        ours_dir = _rendered_by_us(out_dir / "Containerfile")

        def ours(path: Path) -> bool:
            if path.name == "Containerfile":
                return ours_dir
            return ours_dir or _same_text(path, wanted[path.name])

        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InvalidValue(f"{flag} {out_dir}: cannot create it: {exc.strerror or exc}") from None
        for name in wanted:
            outputs.check_target(out_dir / name, flag, force=force, ours=ours)
        written = []
        for name, text in wanted.items():
            outputs.write_text(out_dir / name, text, flag=flag, force=force, ours=ours)
            written.append(out_dir / name)
        return written


RENDERED_MARK = "# Rendered by provision from "


def _rendered_by_us(path: Path) -> bool:
    if not path.is_file():  # opening a FIFO would block
        return False
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith(RENDERED_MARK)
    except (OSError, UnicodeDecodeError):
        return False


def _same_text(path: Path, text: str) -> bool:
    if not path.is_file():
        return False
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


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


def package_stage(env: jinja2.Environment, base: str, stage: str, **context: Any) -> tuple[PackageStage, str]:
    """Render one package stage; its image is named by its own text, so the same packages on
    the same base make one image, shared by every stack that asks for them."""
    text = env.get_template(f"packages-{base}.containerfile.j2").render(stage=stage, **context)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    stage_ref = f"{PACKAGE_IMAGE_REPO}/{base}-{stage}:{digest}"
    return PackageStage(stage, f"Containerfile.packages-{stage}", stage_ref), text


def template_for(stack: catalog.Stack) -> str:
    if stack.base == "fedora":
        return "fedora-source.containerfile.j2"
    return "debian-source.containerfile.j2" if stack.build is not None else "debian-packages.containerfile.j2"


def patch_input_name(patch: str) -> str:
    """Patches are copied flat into the context; names are unique within patches/."""
    return Path(patch).name


def _debian_versions(pins: pins_mod.Pins, section: str, names: tuple[str, ...]) -> list[str]:
    versions = pins.debian.get(section, {})
    return [f"{pkg}={_plain(versions.get(pkg), f'debian.{section}.{pkg}', pins.path)}" for pkg in names]


def version_check(pins: pins_mod.Pins) -> tuple[str, str]:
    """(-D flags, the line ``--version`` must print): the tree has no .git, so without these
    llama.cpp reports build 0, commit "unknown" (cmake/build-info.cmake)."""
    llama = pins.source("llama-cpp")
    rev = _plain(llama["rev"], "sources.llama-cpp.rev", pins.path)[:SHORT_REV]
    number = llama.get("build_number")
    if number is None:
        return f"-DLLAMA_BUILD_COMMIT={rev}", f"commit {rev})"
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        raise InvalidValue(f"{pins.path}: sources.llama-cpp.build_number = {number!r}: expected a positive integer")
    return f"-DLLAMA_BUILD_NUMBER={number} -DLLAMA_BUILD_COMMIT={rev}", f"build {number}, commit {rev})"


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
    env = environment(templates)
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
    stages: dict[str, str] = {}
    package_stages: list[PackageStage] = []

    def add_stage(stage: str, **stage_context: Any) -> None:
        made, text = package_stage(env, stack.base, stage, **stage_context)
        package_stages.append(made)
        files[made.file] = text
        stages[stage] = made.ref

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
        version_flags, version_line = version_check(pins)
        flags = merge_cmake_flags(COMMON_CMAKE_FLAGS, (*version_flags.split(" "), *stack.build.cmake_flags))
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
        labels["krun-gpu.pin.llama-cpp.version"] = version_line.rstrip(")")
        if patch_files:
            labels["krun-gpu.patches"] = ",".join(patch_files)
        files["SHA256SUMS"] = sha256sums([(i.name, i.sha256) for i in inputs])
        # --version prints the build info; the first target that has it is checked in the build.
        tool = next((t for t in stack.build.targets if t in ("llama-cli", "llama-bench", "llama-server")), None)
        if tool is None:
            raise InvalidValue(f"stacks.{stack.name}.build.targets: none of llama-cli, llama-bench, llama-server")
        context.update(sdist=sdist, inputs=list(inputs), cmake_flags=flags, patch_files=patch_files,
                       version_tool=tool, version_line=version_line)

    if stack.base == "fedora":
        fedora = pins.fedora
        for k in ("image", "copr", "mesa_vulkan_drivers", "mesa_filesystem"):
            _plain(fedora.get(k), f"fedora.{k}", pins.path)
        fedora_pins.nevrs(fedora)  # each Mesa NEVR is built for the image's release
        if stack.build is None:
            raise InvalidValue(f"stacks.{stack.name}: the fedora template builds from source and needs a build section")
        labels["org.opencontainers.image.base.name"] = fedora["image"]
        add_stage("builder", fedora=fedora, locked=[], dnf_packages=list(stack.build.packages))
        locked = []
        if stack.mesa == "copr":
            locked = [fedora["mesa_vulkan_drivers"], fedora["mesa_filesystem"]]
            labels["krun-gpu.pin.fedora.copr"] = fedora["copr"]
            labels["krun-gpu.pin.fedora.mesa-vulkan-drivers"] = fedora["mesa_vulkan_drivers"]
            labels["krun-gpu.pin.fedora.mesa-filesystem"] = fedora["mesa_filesystem"]
        add_stage("runtime", fedora=fedora, locked=locked, dnf_packages=list(stack.runtime_packages))
        context.update(fedora=fedora)
    else:
        if not base_image:
            raise InvalidValue(f"stacks.{stack.name}: the debian template needs a local base image")
        _plain(base_image, "base_image", pins.path)
        pins.debian_packages(purpose=f"stack {stack.name}")  # refuses UNVERIFIED Debian pins
        packages = _debian_versions(pins, "guest_packages", stack.packages)
        for entry in packages:
            pkg, version = entry.split("=", 1)
            labels[f"krun-gpu.pin.debian.{pkg}"] = version
        if stack.build is not None:
            add_stage("builder", base_image=base_image,
                      apt_packages=_debian_versions(pins, "build_packages", stack.build.packages))
        if stack.boot is not None:
            boot_packages = _debian_versions(pins, "guest_packages", stack.boot.packages)
            for entry in boot_packages:
                pkg, version = entry.split("=", 1)
                labels[f"krun-gpu.pin.debian.{pkg}"] = version
            add_stage("kernel", base_image=base_image, apt_packages=boot_packages)
        if packages:
            add_stage("runtime", base_image=base_image, apt_packages=packages)
        else:
            stages["runtime"] = base_image
        labels["org.opencontainers.image.base.name"] = base_image
        labels["krun-gpu.pin.debian.suite"] = pins.debian["suite"]
        context.update(base_image=base_image)

    if model is not None:
        _plain(model.filename, "model.filename", pins.path)
        files["SHA256SUMS.model"] = sha256sums([(model.filename, model.sha256)])
        inputs.append(Input(model.filename, model.sha256))
        labels[f"krun-gpu.model.{model.name}.sha256"] = model.sha256
        labels["krun-gpu.model.path"] = f"/opt/models/{model.filename}"

    context["env"] = sorted(stack.guest_env.items())
    context["labels"] = list(labels.items())
    context["stages"] = stages
    template = template_for(stack)
    try:
        text = env.get_template(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise InvalidValue(f"containerfiles/{template}: {exc.message}") from None
    return Rendered(stack.name, template, text, files, tuple(inputs), labels, tuple(package_stages))
