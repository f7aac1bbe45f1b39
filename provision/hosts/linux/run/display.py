"""QEMU's GL context without an X server: SDL's offscreen video driver over EGL.

virtio-gpu-gl needs an OpenGL context on the host. A DRM render node gives ``-display
egl-headless``. Without one, ``-display sdl,gl=on`` with ``SDL_VIDEODRIVER=offscreen``: SDL 3's
offscreen driver makes its context by EGL device enumeration, so it needs no X server, only an
EGL vendor library behind libglvnd: Mesa's (llvmpipe) in the host-tools chroot and on our
machines, the GPU vendor's where the host brings its driver (NVIDIA's in GPU containers, whose vendor
manifest sits under /usr/local/nvidia, where glvnd does not look by itself).

The user names a vendor with glvnd's own variable, ``__EGL_VENDOR_LIBRARY_FILENAMES``; otherwise
the manifests are looked for in glvnd's directories of the tools tree (the chroot's, or the
host's for a bundle or the host's own QEMU) and then in the known driver layouts.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DRIVER_ENV = {"SDL_VIDEODRIVER": "offscreen"}
VENDOR_ENV = "__EGL_VENDOR_LIBRARY_FILENAMES"
VULKAN_ENV = "VK_DRIVER_FILES"
# glvnd's own search order (a chroot's copy, or the host's).
GLVND_DIRS = ("etc/glvnd/egl_vendor.d", "usr/share/glvnd/egl_vendor.d")
# Driver trees glvnd does not search: NVIDIA's container layout (GPU containers).
DRIVER_LAYOUTS = ("usr/local/nvidia/share/glvnd/egl_vendor.d",)
VULKAN_LAYOUTS = ("usr/local/nvidia/share/vulkan/icd.d",)


@dataclass(frozen=True)
class EglVendor:
    manifest: Path
    library: str  # the manifest's library_path
    named: bool  # by the user, through __EGL_VENDOR_LIBRARY_FILENAMES
    standard: bool  # in a directory glvnd searches by itself

    def describe(self) -> str:
        what = "Mesa (llvmpipe unless a GPU driver claims the device)" if "mesa" in self.library.lower() else (
            "NVIDIA" if "nvidia" in self.library.lower() else self.library
        )
        how = "named by " + VENDOR_ENV if self.named else "found"
        return f"{what}: {self.library} from {self.manifest} ({how})"


def _library(manifest: Path) -> str | None:
    try:
        data = json.loads(manifest.read_text())
        lib = data["ICD"]["library_path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return lib if isinstance(lib, str) and lib else None


def egl_vendors(root: Path, env: dict[str, str] | None = None) -> list[EglVendor]:
    """The EGL vendors QEMU's glvnd will try, in its order; ``root`` is the tree QEMU runs in
    (``/`` for a bundle or the host's own QEMU)."""
    env = dict(os.environ) if env is None else env
    named = [p for p in env.get(VENDOR_ENV, "").split(":") if p]
    if named:
        return [EglVendor(Path(p), _library(Path(p)) or "?", True, False) for p in named]
    found: list[EglVendor] = []
    for rel, standard in [(d, True) for d in GLVND_DIRS] + [(d, False) for d in DRIVER_LAYOUTS]:
        d = root / rel
        if d.is_dir():
            for m in sorted(d.glob("*.json")):
                lib = _library(m)
                if lib is not None:
                    found.append(EglVendor(m, lib, False, standard))
        if found and standard:
            break  # glvnd stops at the first directory that has vendors
    return found


def _inside(root: Path, p: Path) -> str:
    """A path as QEMU sees it from inside ``root``."""
    return str(Path("/") / p.relative_to(root))


def run_env(root: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """What QEMU's environment gets for its SDL GL display with no render node: the offscreen
    driver, and the vendor manifest (and Vulkan ICD, for the render server) where the host's
    driver lives outside glvnd's and the Vulkan loader's own directories."""
    env = dict(os.environ) if env is None else env
    out = dict(DRIVER_ENV)
    vendors = egl_vendors(root, env)
    if vendors and not vendors[0].named and not vendors[0].standard:
        out[VENDOR_ENV] = ":".join(_inside(root, v.manifest) for v in vendors)
    if not env.get(VULKAN_ENV) and not env.get("VK_ICD_FILENAMES"):
        icds = [m for d in VULKAN_LAYOUTS for m in sorted((root / d).glob("*.json"))] if vendors else []
        if icds and not any((root / d).is_dir() and any((root / d).glob("*.json"))
                            for d in ("usr/share/vulkan/icd.d", "etc/vulkan/icd.d")):
            out[VULKAN_ENV] = ":".join(_inside(root, m) for m in icds)
    return out
