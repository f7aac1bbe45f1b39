"""Guest images: render a stack, assemble its build context, build it with podman.

The Debian base is made here (debootstrap -> podman import), never pulled from a
registry; its reference is derived from the pins, so rendering stays pure.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import debootstrap, partials, podman
from provision.core import catalog as catalog_mod
from provision.core import layout, locks, paths, settings
from provision.core import pins as pins_mod
from provision.core.errors import InvalidValue
from provision.core.log import say
from provision.images import render, sources


@dataclass(frozen=True)
class StageImage:
    """A package stage's image, built (with the network on) before the stack's own build."""

    stage: str
    ref: str
    result: podman.BuildResult


@dataclass(frozen=True)
class BuiltImage:
    ref: str
    image_id: str
    stack: str
    result: podman.BuildResult
    stages: tuple[StageImage, ...] = ()

    @property
    def totals(self) -> podman.BuildResult:
        """Steps of every build this image took (package stages + the offline build)."""
        parts = [s.result for s in self.stages] + [self.result]
        return podman.BuildResult(
            self.image_id,
            sum(p.steps for p in parts),
            sum(p.layer_steps for p in parts),
            sum(p.cached_steps for p in parts),
            self.result.size,
        )


# Bump when the base's recipe changes in a way the pins do not show.
BASE_RECIPE = 2
# Guest images carry no documentation, manual pages or translations (the copyright files stay):
# dpkg skips them for every package installed on the base, and the base drops its own.
DPKG_NODOC = """\
# krun-gpu: no documentation or translations in guest images (copyright files stay).
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/lintian/*
"""


def _short(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def base_ref(base: str, pins: pins_mod.Pins) -> str:
    """Local reference of a base image, keyed by the pins it depends on (pure)."""
    if base != "debian":
        raise InvalidValue(f"base {base!r}: only the debian base is made locally")
    deb = pins.debian
    key = _short({"suite": deb["suite"], "variant": "minbase", "snapshot": deb["provenance"], "recipe": BASE_RECIPE})
    return f"localhost/krun-gpu-base/debian-{deb['suite']}:{key}"


def ensure_base(base: str, pins: pins_mod.Pins | None = None) -> str:
    pins = pins or pins_mod.default()
    ref = base_ref(base, pins)
    if podman.exists(ref):
        return ref
    name = ref.rsplit("/", 1)[1].replace(":", "-")
    # One maker per base: a second caller waits, then finds the image.
    with locks.held(paths.cache_dir("rootfs") / f"{name}.lock"):
        if podman.exists(ref):
            return ref
        rootfs = paths.cache_dir("rootfs") / name
        debootstrap.make_rootfs(pins.debian["suite"], rootfs)
        slim_rootfs(rootfs)
        podman.import_rootfs(rootfs, ref)
        shutil.rmtree(rootfs, ignore_errors=True)
    return ref


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def slim_rootfs(rootfs: Path) -> None:
    """What no guest needs, gone before the base is imported (a later layer cannot shrink it):
    apt's package lists and downloaded archives, documentation and translations."""
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/krun-gpu-nodoc").write_text(DPKG_NODOC)
    keep = {"lock", "partial", "copyright", "locale.alias"}
    for pattern in ("var/lib/apt/lists/*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb",
                    "usr/share/man/*", "usr/share/info/*", "usr/share/lintian/*", "usr/share/locale/*",
                    "usr/share/doc/*/*"):
        for path in rootfs.glob(pattern):
            if path.name not in keep:
                _remove(path)


def offline_cmake_input() -> tuple[Path, str]:
    path = layout.patches_dir() / "cmake" / render.OFFLINE_CMAKE_INCLUDE
    return path, sources.sha256_file(path)


def local_input_files(stack: catalog_mod.Stack) -> dict[str, Path]:
    """Our own files a stack's build copies in: the offline CMake include and patches."""
    files: dict[str, Path] = {}
    if stack.needs_virtgpu_frontend:
        files[render.OFFLINE_CMAKE_INCLUDE] = offline_cmake_input()[0]
    if stack.build is not None:
        for patch in stack.build.patches:
            files[render.patch_input_name(patch)] = layout.patches_dir() / patch
    return files


def render_stack(
    stack: catalog_mod.Stack,
    pins: pins_mod.Pins,
    *,
    base_image: str | None = None,
    model: render.ModelInput | None = None,
) -> render.Rendered:
    local = {name: sources.sha256_file(path) for name, path in local_input_files(stack).items()}
    if stack.base == "debian" and base_image is None:
        base_image = base_ref("debian", pins)
    return render.render(stack, pins, base_image=base_image, local_inputs=local, model=model)


def _link_or_copy(src: Path, dest: Path) -> None:
    if dest.exists():
        dest.unlink()
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def prepare_context(rendered: render.Rendered, stack: catalog_mod.Stack, model_path: Path | None) -> Path:
    """Write the Containerfile and link every input into a context dir keyed by content."""
    key = _short({"containerfile": rendered.containerfile, "files": rendered.files})
    context = paths.cache_dir("contexts") / f"{stack.name}-{key}"
    tmp = context.with_name(context.name + ".partial")
    partials.remove(tmp)
    rendered.write(tmp)
    local = local_input_files(stack)
    for item in rendered.inputs:
        if item.name in local:
            src = local[item.name]
        elif model_path is not None and item.name.endswith(".gguf"):
            src = model_path
        else:
            from provision.images import sources  # the pinned sdist: pip download + sha256 check

            src = sources.sdist_path()
        _link_or_copy(src, tmp / item.name)
    if context.exists():
        shutil.rmtree(context)
    tmp.rename(context)
    return context


def default_tag(rendered: render.Rendered) -> str:
    return f"localhost/krun-gpu/{rendered.stack}:{_short(rendered.containerfile)}"


def build(
    stack_name: str,
    *,
    tag: str | None = None,
    model: str | None = None,
    catalog: catalog_mod.Catalog | None = None,
    pins: pins_mod.Pins | None = None,
    base_image: str | None = None,
    log: Callable[[str], None] | None = None,
) -> BuiltImage:
    pins = pins or pins_mod.default()
    catalog = catalog or catalog_mod.load()
    stack = catalog.get(stack_name)
    model_input = None
    model_path = None
    if model is not None:
        from provision.models import store as models  # the verified model store

        model_path = models.ensure(model)
        digest = model_path.name.removeprefix("sha256-")
        model_input = render.ModelInput(model, f"{model}.gguf", digest)
    if stack.base == "debian" and base_image is None:
        base_image = ensure_base("debian", pins)
    rendered = render_stack(stack, pins, base_image=base_image, model=model_input)
    context = prepare_context(rendered, stack, model_path)
    ref = tag or default_tag(rendered)
    flags = host_flags()
    stages = []
    for stage in rendered.package_stages:
        say("image")(f"image: {stack.name}: {stage.stage} packages as {stage.ref} (network on)")
        stage_result = podman.build(context, stage.ref, flags, containerfile=stage.file, log=log)
        stages.append(StageImage(stage.stage, stage.ref, stage_result))
    say("image")(f"image: building {stack.name} as {ref} ({' '.join(flags.args()) or 'default isolation'}, "
                 "network off)")
    result = podman.build(context, ref, flags, offline=True, log=log)
    return BuiltImage(ref=ref, image_id=result.image_id, stack=stack.name, result=result, stages=tuple(stages))


def host_flags(given: settings.Settings | None = None) -> podman.BuildFlags:
    """podman's flags on this host: what it needs, the setting podman_isolation over its isolation."""
    s = given or settings.current()
    return podman.decide_flags(podman.probe_host(), s.get("podman_isolation"), s.shown("podman_isolation"))


def export_rootfs(image_ref: str, dest: Path) -> Path:
    return podman.export_rootfs(image_ref, dest, host_flags())
