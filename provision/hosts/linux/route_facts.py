"""What this Linux host has for the route choice (routes.choose), read from the file system only (no
program is started, so it is cheap enough for every `provision run`): render nodes under /dev/dri
and their kernel drivers (/sys/class/drm), NVIDIA GPUs (/proc/driver/nvidia/gpus), Vulkan ICD
manifests on the host and in the host tools, the APIR host side (`host-tools --apir`), a cached
CUDA ggml build (`ggml build --variant cuda`), the newest APIR-vs-Venus bench.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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
        vulkan_icds=vulkan_icds([root, *_host_tools_roots()], loader_env=os.environ),
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


# The Vulkan loader's own override: with one set, the host's loader reads those manifests (files or
# folders, colon-separated) and not its search folders, so the host's drivers are those.
LOADER_OVERRIDES = ("VK_DRIVER_FILES", "VK_ICD_FILENAMES")


def vulkan_icds(roots: list[Path], loader_env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """ICD manifest names under each root's search folders; for the first root (the host's), what
    ``loader_env``'s override names instead when it names any."""
    names: set[str] = set()
    env = loader_env or {}
    override = next((env[k] for k in LOADER_OVERRIDES if env.get(k)), None)
    for i, r in enumerate(roots):
        if i == 0 and override is not None:
            for item in (Path(x) for x in override.split(":") if x):
                names.update([item.name] if item.is_file() else (p.name for p in item.glob("*.json")))
            continue
        for d in ICD_DIRS:
            folder = r / d
            if folder.is_dir():
                names.update(p.name for p in folder.glob("*.json"))
    # virtio_icd is the guest's Venus driver: on the host it has no device.
    return tuple(sorted(n for n in names if not n.startswith("virtio_icd")))


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


def _host_tools_roots() -> list[Path]:
    from provision.hosts.linux.tools import host_tools

    found = host_tools.locate()
    return [found.root] if found is not None and found.root != Path("/") else []


def _apir_host_tools() -> bool:
    from provision.hosts.linux.apir import host_side

    return host_side.locate() is not None
