"""QEMU's GL display without an X server: which EGL vendor SDL's offscreen driver gets, and what
QEMU's environment carries for a host whose GPU driver lives outside glvnd's directories."""

from __future__ import annotations

import json
from pathlib import Path

from provision.hosts.linux.run import display


def manifest(root: Path, rel: str, library: str) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": library}}))
    return p


def test_glvnd_directories_come_first_and_need_no_variable(tmp_path: Path) -> None:
    mesa = manifest(tmp_path, "usr/share/glvnd/egl_vendor.d/50_mesa.json", "libEGL_mesa.so.0")
    manifest(tmp_path, "usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json", "libEGL_nvidia.so.0")
    vendors = display.egl_vendors(tmp_path, {})
    assert [v.manifest for v in vendors] == [mesa] and vendors[0].standard and not vendors[0].named
    assert display.run_env(tmp_path, {}) == {"SDL_VIDEODRIVER": "offscreen"}


def test_nvidias_container_layout_is_found_and_named_to_glvnd_and_the_vulkan_loader(tmp_path: Path) -> None:
    # The lent H200: NVIDIA's manifests under /usr/local/nvidia only, where neither loader looks.
    manifest(tmp_path, "usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json", "libEGL_nvidia.so.0")
    manifest(tmp_path, "usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json", "libGLX_nvidia.so.0")
    vendors = display.egl_vendors(tmp_path, {})
    assert len(vendors) == 1 and "NVIDIA" in vendors[0].describe() and "found" in vendors[0].describe()
    assert display.run_env(tmp_path, {}) == {
        "SDL_VIDEODRIVER": "offscreen",
        display.VENDOR_ENV: "/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json",
        display.VULKAN_ENV: "/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json",
    }


def test_a_vendor_the_user_names_wins_and_is_left_as_given(tmp_path: Path) -> None:
    manifest(tmp_path, "usr/share/glvnd/egl_vendor.d/50_mesa.json", "libEGL_mesa.so.0")
    mine = manifest(tmp_path, "opt/drv/10_vendor.json", "libEGL_vendor.so.0")
    env = {display.VENDOR_ENV: str(mine), display.VULKAN_ENV: "/opt/drv/icd.json"}
    vendors = display.egl_vendors(tmp_path, env)
    assert [v.library for v in vendors] == ["libEGL_vendor.so.0"] and vendors[0].named
    assert "named by __EGL_VENDOR_LIBRARY_FILENAMES" in vendors[0].describe()
    # QEMU inherits the user's variables; provision adds only the driver choice.
    assert display.run_env(tmp_path, env) == {"SDL_VIDEODRIVER": "offscreen"}


def test_a_broken_manifest_is_no_vendor(tmp_path: Path) -> None:
    bad = tmp_path / "usr/share/glvnd/egl_vendor.d/50_bad.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    manifest(tmp_path, "usr/share/glvnd/egl_vendor.d/60_none.json", "")
    assert display.egl_vendors(tmp_path, {}) == []
