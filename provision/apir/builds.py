"""Cached ggml builds from the pinned llama.cpp tree (`provision ggml build`).

A build runs in a work directory keyed like its result, then its bin/ directory (RUNPATH
$ORIGIN, so relocatable) and a build.json manifest are staged and renamed into
``cache_dir("ggml", key)``: a half-built result is never visible under its key.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import apt, cmake, runner
from provision.apir import ggml as ggml_build
from provision.core import layout, locks, paths, pins
from provision.core.errors import SourceUnavailable, ToolMissing
from provision.images import sources

# The include lives with our patches (layout.patches_dir), shared by images, builds and Nix.
OFFLINE_INCLUDE = layout.patches_dir() / "cmake" / "ggml-virtgpu-offline.cmake"
DRM_PACKAGE = "linux-libc-dev"


@dataclass(frozen=True)
class Built:
    variant: str
    key: str
    bin_dir: Path
    manifest: dict[str, object]

    def library(self, name: str) -> Path:
        return self.bin_dir / name


def offline_include() -> Path:
    if not OFFLINE_INCLUDE.is_file():
        raise SourceUnavailable(f"{OFFLINE_INCLUDE} is missing; every ggml-virtgpu configure needs it",
                                fix="run provision from a checkout of krun-gpu (patches/ is not packaged)")
    return OFFLINE_INCLUDE


def drm_headers_dir(pin_set: pins.Pins | None = None) -> Path:
    sha256 = str((pin_set or pins.default()).debian["build_packages_sha256"][DRM_PACKAGE])
    return paths.cache_dir("sources") / f"kdrm-{sha256[:16]}"


def drm_headers(pin_set: pins.Pins | None = None) -> Path:
    """An include directory holding drm/ from the pinned newer linux-libc-dev (guest build only).

    Debian 12 ships no /usr/include/drm and libdrm's copy predates CONTEXT_INIT; the execbuffer
    syncobj fields ggml-virtgpu uses arrived in kernel UAPI 6.14. Only drm/ is taken, so the
    rest of the system's kernel headers (matching its glibc) stay in charge.
    """
    pin_set = pin_set or pins.default()
    deb = pin_set.debian
    version = str(deb["build_packages"][DRM_PACKAGE])
    sha256 = str(deb["build_packages_sha256"][DRM_PACKAGE])
    cache = paths.cache_dir("sources")
    include = drm_headers_dir(pin_set)
    if (include / "drm" / "virtgpu_drm.h").exists():
        return include
    with locks.held(cache / f"{include.name}.lock"), tempfile.TemporaryDirectory(dir=cache,
                                                                                      prefix=".kdrm-") as tmp:
        if (include / "drm" / "virtgpu_drm.h").exists():
            return include
        tmpdir = Path(tmp)
        (tmpdir / "deb").mkdir()
        got = apt.download(DRM_PACKAGE, version, suite=str(deb["suite"]), dest=tmpdir / "deb")
        actual = sources.sha256_file(got)
        if actual != sha256:
            raise SourceUnavailable(
                f"{got.name}: sha256 {actual}, but debian.build_packages_sha256.{DRM_PACKAGE} in {pin_set.path} "
                f"says {sha256}",
                fix=f"re-pin debian.build_packages.{DRM_PACKAGE} and its sha256 together in {pin_set.path}",
            )
        apt.extract(got, tmpdir / "root")
        staged = tmpdir / "include"
        staged.mkdir()
        shutil.copytree(tmpdir / "root" / "usr" / "include" / "drm", staged / "drm")
        text = (staged / "drm" / "virtgpu_drm.h").read_text()
        if "num_in_syncobjs" not in text:
            raise SourceUnavailable(f"{DRM_PACKAGE} {version}: drm/virtgpu_drm.h has no execbuffer syncobj fields",
                                    fix=f"pin a {DRM_PACKAGE} from kernel 6.14 or newer")
        os.replace(staged, include)
    return include


def llama_patches() -> Path:
    return layout.patches_dir() / "llama.cpp"


def patch_digest(names: tuple[str, ...], source_id: str = "") -> str:
    """What a patched copy of a tree is keyed by: the source and each patch's name and bytes."""
    h = hashlib.sha256(source_id.encode())
    for name in names:
        h.update(name.encode() + b"\0" + (llama_patches() / name).read_bytes())
    return h.hexdigest()[:16]


def patched_tree(tree: Path, names: tuple[str, ...], source_id: str, *, fetch: bool = True) -> Path:
    """A copy of ``tree`` with our patches applied in order, made once in the cache (the tree is never changed)."""
    if not names:
        return tree
    cache = paths.cache_dir("sources")
    dest = cache / f"{tree.name}-patched-{patch_digest(names, source_id)}"
    if not fetch or dest.is_dir():
        return dest
    with locks.held(str(dest) + ".lock"):
        if dest.is_dir():
            return dest
        with tempfile.TemporaryDirectory(dir=cache, prefix=f".{dest.name}-") as tmp:
            staged = Path(tmp) / "tree"
            shutil.copytree(tree, staged, symlinks=True)
            for name in names:
                argv = ["patch", "-p1", "--forward", "--batch", "-d", str(staged), "-i", str(llama_patches() / name)]
                runner.run(argv, error=SourceUnavailable, what=f"patch {name}", missing_fix="install patch",
                           fix=f"patches/llama.cpp/{name} no longer applies to {tree}: re-base it on the pinned tree")
            os.replace(staged, dest)
    return dest


def plan_for(variant_name: str, *, jobs: int = 2, cuda_architectures: str | None = None,
             source: Path | None = None, pin_set: pins.Pins | None = None,
             fetch: bool = True) -> tuple[ggml_build.BuildPlan, str]:
    """The plan and the source id it is keyed by; fetch=False (dry run) downloads and extracts nothing."""
    pin_set = pin_set or pins.default()
    v = ggml_build.variant(variant_name)
    if source is None:
        tree = sources.llama_cpp_tree(pin_set) if fetch else sources.tree_dir(pin_set)
        source_id = str(pin_set.source(sources.SDIST_PIN)["sha256"])
    else:
        # A trimmed copy of the same tree (the GPU machine has no network); keyed by its path.
        tree = source.resolve()
        source_id = f"local:{tree}"
    if v.patches:  # the host-side fixes, on a copy (ggml.HOST_PATCHES)
        tree = patched_tree(tree, v.patches, source_id, fetch=fetch)
        source_id = f"{source_id}+patches:{patch_digest(v.patches)}"
    drm_dir = None
    if v.needs_drm_headers:
        drm_dir = drm_headers(pin_set) if fetch else drm_headers_dir(pin_set)
    key = ggml_build.cache_key(v, source_sha256=source_id, cuda_architectures=cuda_architectures,
                               drm_headers_sha256=(str(pin_set.debian["build_packages_sha256"][DRM_PACKAGE])
                                                   if drm_dir else None))
    work = paths.cache_root() / "ggml" / "work" / key
    plan = ggml_build.plan(v, source=tree, build_dir=work, key=key, offline_include=offline_include(),
                           jobs=jobs, cuda_architectures=cuda_architectures, drm_include_dir=drm_dir)
    return plan, source_id


VULKAN_HEADER = Path("/usr/include/vulkan/vulkan_core.h")
# ggml-vulkan at the pinned rev creates its instance with VK_EXT_layer_settings (vk::LayerSettingEXT).
VULKAN_REQUIRED_EXTENSION = "VK_EXT_layer_settings"


def vulkan_headers_problem(header: Path = VULKAN_HEADER) -> str | None:
    """Why the system Vulkan headers cannot build ggml-vulkan, or None. Checked before a 10-minute
    build fails on it (Debian 12's libvulkan-dev 1.3.239 lacks the extension)."""
    try:
        text = header.read_text(errors="replace")
    except OSError as exc:
        return f"{header}: {exc.strerror} (install libvulkan-dev)"
    if VULKAN_REQUIRED_EXTENSION in text:
        return None
    version = re.search(r"#define VK_HEADER_VERSION (\d+)", text)
    return (f"{header} (header version {version.group(1) if version else '?'}) has no {VULKAN_REQUIRED_EXTENSION}, "
            "which ggml-vulkan uses")


def ensure(variant_name: str, *, jobs: int = 2, cuda_architectures: str | None = None,
           source: Path | None = None, pin_set: pins.Pins | None = None, force: bool = False) -> Built:
    """The promoted build for a variant: from the cache, or built now."""
    pin_set = pin_set or pins.default()
    v = ggml_build.variant(variant_name)
    cmake.require_tools(v.tools, variant=v.name)
    if v.name == "vulkan" and (problem := vulkan_headers_problem()):
        raise ToolMissing(problem, fix="install Vulkan headers with VK_EXT_layer_settings (libvulkan-dev from "
                                        "Debian 13 or sid, or the LunarG SDK) and put them first on the include path")
    plan, source_id = plan_for(variant_name, jobs=jobs, cuda_architectures=cuda_architectures, source=source,
                               pin_set=pin_set)
    protocol = sources.apir_protocol(plan.source, pin_set)
    key = plan.key
    root = paths.cache_dir("ggml")
    promoted = root / key
    with locks.held(root / f"{key}.lock"):
        if force and promoted.exists():
            shutil.rmtree(promoted)
        if (promoted / "build.json").exists():
            return Built(v.name, key, promoted / "bin", json.loads((promoted / "build.json").read_text()))
        work = plan.build_dir
        log = root / f"{key}.log"
        started = time.monotonic()
        timings = cmake.run(plan, log=log)
        timings["total_s"] = round(time.monotonic() - started, 1)
        manifest: dict[str, object] = {
            "variant": v.name, "key": key, "source": str(plan.source), "build_dir": str(work),
            "source_id": source_id, "patches": list(v.patches), "apir_protocol": list(protocol),
            "targets": list(v.targets),
            "configure": plan.configure, "jobs": jobs, "timings": timings, "machine": platform.machine(),
            "cpus": os.cpu_count(), "ggml_library": v.ggml_library, "ggml_reg": v.ggml_reg,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{key}-") as tmp:
            staged = Path(tmp) / key
            shutil.copytree(work / "bin", staged / "bin", symlinks=True)
            (staged / "build.json").write_text(json.dumps(manifest, indent=2) + "\n")
            os.replace(staged, promoted)
        return Built(v.name, key, promoted / "bin", manifest)
