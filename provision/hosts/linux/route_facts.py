"""What this Linux host has for the route choice (routes.choose), read from the file system only (no
program is started, so it is cheap enough for every `provision run`): render nodes under /dev/dri
and their kernel drivers (/sys/class/drm), NVIDIA GPUs (/proc/driver/nvidia/gpus), Vulkan ICD
manifests on the host and in the host tools, the APIR host side (`host-tools --apir`), a cached
CUDA ggml build (`ggml build --variant cuda`), the newest APIR-vs-Venus bench.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from provision.bench import history_file
from provision.core import paths
from provision.routes.choose import HostFacts, RenderNode

ICD_DIRS = ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d")
CUDA_VARIANTS = ("cuda", "cuda-tools")


def facts(root: Path = Path("/")) -> HostFacts:
    """This host's facts; ``root`` lets a test point the probes at a made-up tree."""
    return HostFacts(
        platform="linux",
        render_nodes=render_nodes(root),
        nvidia_gpus=nvidia_gpus(root),
        cuda_backend=cuda_backend(),
        apir_host_tools=_apir_host_tools(),
        vulkan_icds=vulkan_icds([root, *_host_tools_roots(chroot=False)], _host_tools_roots(chroot=True), os.environ),
        apir_speedup=history_file.apir_speedup_measured(),
    )


def render_nodes(root: Path) -> tuple[RenderNode, ...]:
    dri = root / "dev" / "dri"
    found = []
    for node in sorted(dri.glob("renderD*")) if dri.is_dir() else []:
        driver = root / "sys" / "class" / "drm" / node.name / "device" / "driver"
        name = os.path.basename(os.readlink(driver)) if driver.is_symlink() else None
        found.append(RenderNode(f"/dev/dri/{node.name}", name))
    return tuple(found)


def nvidia_gpus(root: Path) -> tuple[str, ...]:
    """Model names from the NVIDIA driver's /proc files (``Model:  NVIDIA H200``)."""
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    names = []
    for info in sorted(gpus.glob("*/information")) if gpus.is_dir() else []:
        try:
            text = info.read_text(errors="replace")
        except OSError:
            continue
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model:")), None)
        names.append(model or "NVIDIA GPU")
    return tuple(names)


# The Vulkan loader's own variables. An override (the first set wins) names the manifests (files or folders,
# colon-separated) the loader reads instead of its search folders, and turns VK_ADD_DRIVER_FILES off;
# without one, VK_ADD_DRIVER_FILES adds to them. (VK_LOADER_DRIVERS_SELECT/DISABLE are not modelled.)
LOADER_OVERRIDES = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")
LOADER_ADDITIONS = "VK_ADD_DRIVER_FILES"


def vulkan_icds(
    roots: Sequence[Path], clean_roots: Sequence[Path] = (), loader_env: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """ICD manifest names the Vulkan loader finds: under ``roots`` (the host, a bundle: programs that run with
    this environment, so ``loader_env``'s variables apply) and ``clean_roots`` (a chroot, entered with a clean
    environment: its search folders only)."""
    env = loader_env or {}
    override = next((env[k] for k in LOADER_OVERRIDES if env.get(k)), None)
    names = set(_listed(override)) if override is not None else {*_searched(roots), *_listed(env.get(LOADER_ADDITIONS))}
    names.update(_searched(clean_roots))
    # virtio_icd is the guest's Venus driver: on the host it has no device.
    return tuple(sorted(n for n in names if not n.startswith("virtio_icd")))


def _searched(roots: Sequence[Path]) -> set[str]:
    return {p.name for r in roots for d in ICD_DIRS if (r / d).is_dir() for p in (r / d).glob("*.json")}


def _listed(paths: str | None) -> set[str]:
    names: set[str] = set()
    for item in (Path(x) for x in (paths or "").split(":") if x):
        names.update([item.name] if item.is_file() else (p.name for p in item.glob("*.json")))
    return names


def cuda_backend() -> str | None:
    """A promoted ggml host build of a CUDA variant (``provision ggml build --variant cuda``)."""
    ggml = paths.cache_root() / "ggml"
    for manifest in sorted(ggml.glob("*/build.json")) if ggml.is_dir() else []:
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue
        lib = manifest.parent / "bin" / "libggml-cuda.so"
        if isinstance(data, dict) and data.get("variant") in CUDA_VARIANTS and lib.is_file():
            return str(lib)
    return None


def _host_tools_roots(*, chroot: bool) -> list[Path]:
    """The host tools' root when it is (``chroot``) or is not (a bundle, run with this environment) a chroot."""
    from provision.hosts.linux.tools import host_tools

    found = host_tools.locate()
    if found is None or found.root == Path("/") or found.is_chroot != chroot:
        return []
    return [found.root]


def _apir_host_tools() -> bool:
    from provision.hosts.linux.apir import host_side

    return host_side.locate() is not None
