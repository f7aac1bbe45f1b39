"""A relocatable host-tools bundle: the Linux route on a host with neither Debian sid nor a network.

`provision host-tools --bundle OUT.tar.zst` copies out of the sid chroot what the route
loads (QEMU and the modules it loads, virglrenderer's render server, the GL/Vulkan loaders,
Mesa's software drivers unless the host brings its own GPU driver (``--host-driver``),
firmware, and a guest disk) with their
shared-library closure, the loader and libc included: the chroot's glibc is newer than
most hosts', so every program starts through the carried ``ld-linux-x86-64.so.2
--library-path`` from a small wrapper script at the path the chroot had it. GPU drivers
(NVIDIA's Vulkan ICD and EGL vendor library) stay the host's: the carried loaders find them
through the host's own manifests and ``ld.so.cache``, or the manifests the user names
(run/display.py). QEMU's GL display is SDL's offscreen driver over EGL: no X server travels.

`provision host-tools --from OUT.tar.zst` installs it (bundle_archive.py; a ``.tar.xz`` or
``.tar.gz`` bundle installs with Python alone, where the target has no zstd); `host_tools.locate()`
then finds it as one more kind of HostTools.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters import elf
from provision.core import pins as pins_mod
from provision.core.catalog import Stack
from provision.core.errors import HostToolsMissing
from provision.core.log import say
from provision.hosts.linux.tools.bundle_archive import FORMAT, MANIFEST, compression_for, hashes, pack
from provision.hosts.linux.tools.host_tools import HostTools
from provision.images import build as images
from provision.images.disks import RootDisk

LIB = "usr/lib/x86_64-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"
REAL = "usr/lib/krun-gpu/bin"  # the programs themselves; their old paths hold wrappers
# Programs: chroot path -> what the wrapper adds (environment lines, extra arguments).
PROGRAMS = {
    "usr/bin/qemu-system-x86_64": "qemu",
    "usr/libexec/virgl_render_server": "render-server",
}
# Loaded with dlopen, so no DT_NEEDED names them and the ELF closure cannot find them: what a
# GPU run in the chroot maps (/proc/PID/maps: QEMU's SDL GL display, virglrenderer through
# libepoxy, Venus through the Vulkan loader). Globs relative to the chroot root.
DLOPENED = (
    f"{LIB}/qemu/hw-display-virtio-gpu.so",
    f"{LIB}/qemu/hw-display-virtio-gpu-gl.so",
    f"{LIB}/qemu/hw-display-virtio-gpu-pci.so",
    f"{LIB}/qemu/hw-display-virtio-gpu-pci-gl.so",
    f"{LIB}/qemu/ui-opengl.so",
    f"{LIB}/qemu/ui-sdl.so",
    f"{LIB}/qemu/ui-egl-headless.so",
    f"{LIB}/libvirglrenderer.so.1",
    f"{LIB}/libvulkan.so.1",
    f"{LIB}/libGL.so.1",
    f"{LIB}/libGLX.so.0",
    f"{LIB}/libEGL.so.1",
    f"{LIB}/libGLdispatch.so.0",
    f"{LIB}/libOpenGL.so.0",
    f"{LIB}/libX*.so.[0-9]",
    f"{LIB}/libxkbcommon.so.0",
    f"{LIB}/libSDL3.so.0",
)
# Firmware a q35 guest booted with -kernel loads (SeaBIOS, its option ROMs, the NIC ROM
# of a forwarded port), not the 12 MB of every machine type.
FIRMWARE = ("bios-256k.bin", "kvmvapic.bin", "linuxboot_dma.bin", "efi-virtio.rom")
# Debian's QEMU looks in both; the bundle's wrapper gives QEMU one directory (-L).
FIRMWARE_DIRS = ("usr/share/qemu", "usr/share/seabios")
# Mesa's software drivers (llvmpipe EGL, lavapipe; with libLLVM, libgallium, libz3 behind them):
# the GPU of a host without one. Left out for a host that brings its own driver.
MESA_DRIVERS = (
    f"{LIB}/libGLX_mesa.so.0",
    f"{LIB}/libEGL_mesa.so.0",
    f"{LIB}/dri/swrast_dri.so",
    f"{LIB}/libvulkan_lvp.so",
)
VULKAN_ICDS = {"lvp_icd.json": "libvulkan_lvp.so"}
EGL_VENDORS = {"50_mesa.json": "libEGL_mesa.so.0"}
GUEST_DIR = "guest"
# The APIR route's virglrenderer, built in the chroot by `provision host-tools --apir` (hosts/linux/apir/host_side.py).
APIR_FILES = ("opt/virgl-apir/lib/libvirglrenderer.so.1", "opt/virgl-apir/libexec/virgl_render_server")


@dataclass(frozen=True)
class Guest:
    """A stack's VM disk as the bundle carries it (made by disks.root_disk for the pinned image)."""

    stack: str
    image: str
    image_id: str
    kernel: Path
    initrd: Path
    disk: Path


def _resolve(root: Path, rel: str) -> Path | None:
    """``rel`` inside the tree at ``root``, symlinks followed without leaving it."""
    parts = PurePosixPath(rel.lstrip("/"))
    for _ in range(40):
        p = root / parts
        if p.is_symlink():
            target = os.readlink(p)
            parts = PurePosixPath(target.lstrip("/")) if target.startswith("/") else parts.parent / target
            parts = PurePosixPath(os.path.normpath(parts))
            continue
        return p if p.exists() else None
    return None


def _find_library(root: Path, name: str, origin: PurePosixPath, runpath: Iterable[str]) -> Path | None:
    dirs = [r.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin)) for r in runpath]
    dirs += [f"/{LIB}", "/usr/lib", "/lib/x86_64-linux-gnu"]
    for d in dirs:
        found = _resolve(root, f"{d.rstrip('/')}/{name}")
        if found is not None:
            return found
    return None


def closure(root: Path, starts: Iterable[str]) -> dict[str, Path]:
    """Every shared library the ELF files ``starts`` (chroot paths) need: soname -> file."""
    libs: dict[str, Path] = {}
    todo = [(PurePosixPath("/" + s.lstrip("/")), _resolve(root, s)) for s in starts]
    missing: list[str] = []
    while todo:
        where, path = todo.pop()
        if path is None or not elf.is_elf(path):
            continue
        dyn = elf.read(path)
        for name in dyn.needed:
            if name in libs:
                continue
            found = _find_library(root, name, where.parent, dyn.runpath)
            if found is None:
                missing.append(f"{name} (needed by {where})")
                continue
            libs[name] = found
            todo.append((PurePosixPath("/") / found.relative_to(root), found))
    if missing:
        raise HostToolsMissing(
            f"libraries missing in the host-tools chroot {root}: {', '.join(sorted(missing))}",
            fix="rebuild the chroot: `provision host-tools --force`",
        )
    return libs


def wrapper(real: str, kind: str, depth: int) -> str:
    """The script at a program's old path: the bundled loader, libraries and settings."""
    up = "/".join([".."] * depth)
    lines = [
        "#!/bin/sh",
        "# Written by `provision host-tools --bundle`: start the bundled program with the bundled loader and libc.",
        # ${0%/*}, not dirname: the wrapper needs no program from the host but sh.
        f'here=$(cd -P "${{0%/*}}/{up}" && pwd)',
        f'lib="$here/{LIB}"',
        # Our libraries after the caller's (the APIR route puts its own virglrenderer first);
        # --library-path replaces LD_LIBRARY_PATH, which the host's own programs then never see with our libc.
        'libs="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib"',
        'export LIBGL_DRIVERS_PATH="$lib/dri"',
        'export __EGL_VENDOR_LIBRARY_DIRS="$here/usr/share/glvnd/egl_vendor.d:/etc/glvnd/egl_vendor.d:'
        '/usr/share/glvnd/egl_vendor.d"',
        'export VK_ADD_DRIVER_FILES="$here/usr/share/vulkan/icd.d${VK_ADD_DRIVER_FILES:+:$VK_ADD_DRIVER_FILES}"',
    ]
    args = '"$@"'
    if kind == "qemu":
        lines += [
            'export QEMU_MODULE_DIR="$lib/qemu"',
            'export RENDER_SERVER_EXEC_PATH="${RENDER_SERVER_EXEC_PATH:-$here/usr/libexec/virgl_render_server}"',
        ]
        args = '-L "$here/usr/share/qemu" "$@"'
    lines.append(f'exec "$lib/{LOADER}" --library-path "$libs" --argv0 "$0" "$here/{real}" {args}')
    return "\n".join(lines) + "\n"


def icd_manifest(library: str, depth: int) -> str:
    """A Vulkan ICD manifest naming its library relative to itself (the loader allows that)."""
    rel = "/".join([".."] * depth) + f"/{LIB}/{library}"
    return json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": rel, "api_version": "1.4.0"}})


def stage(
    root: Path,
    out: Path,
    guests: Sequence[Guest],
    log: Callable[[str], None],
    *,
    host_driver: bool = False,
    apir: bool = False,
) -> dict[str, object]:
    """Lay the bundle out in ``out`` from the chroot at ``root``; returns the manifest (written too).
    ``host_driver``: the host brings its GPU's EGL and Vulkan drivers, Mesa's software ones stay out."""
    starts = list(PROGRAMS) + (list(APIR_FILES) if apir else [])
    for pattern in DLOPENED + (() if host_driver else MESA_DRIVERS):
        starts += [str(p.relative_to(root)) for p in sorted(root.glob(pattern))]
    libs = closure(root, starts)
    lib_dir = out / LIB
    lib_dir.mkdir(parents=True)
    loader = _resolve(root, f"{LIB}/{LOADER}")
    if loader is None:
        raise HostToolsMissing(f"no {LOADER} in {root}", fix="rebuild the chroot: `provision host-tools --force`")
    shutil.copyfile(loader, lib_dir / LOADER)
    (lib_dir / LOADER).chmod(0o755)
    for name, path in sorted(libs.items()):
        shutil.copyfile(path, lib_dir / name)
    for rel in starts:
        if rel in PROGRAMS or rel in APIR_FILES:
            continue
        src = _resolve(root, rel)
        dest = out / rel
        if src is not None and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    for rel, kind in PROGRAMS.items():
        src = _resolve(root, rel)
        if src is None:
            raise HostToolsMissing(f"{rel} is missing in {root}", fix="rebuild the chroot: `provision host-tools`")
        real = f"{REAL}/{PurePosixPath(rel).name}"
        (out / real).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out / real)
        _write_script(out / rel, wrapper(real, kind, len(PurePosixPath(rel).parts) - 1))
    (out / "usr/share/qemu").mkdir(parents=True)
    for name in FIRMWARE:
        found = [p for p in (_resolve(root, f"{d}/{name}") for d in FIRMWARE_DIRS) if p is not None]
        if not found:
            raise HostToolsMissing(f"QEMU firmware {name} is missing in {root}", fix="rebuild the chroot")
        shutil.copyfile(found[0], out / "usr/share/qemu" / name)
    icd_dir = out / "usr/share/vulkan/icd.d"
    icd_dir.mkdir(parents=True)
    for json_name, library in VULKAN_ICDS.items():
        if (lib_dir / library).exists():
            (icd_dir / json_name).write_text(icd_manifest(library, 4))
    egl_dir = out / "usr/share/glvnd/egl_vendor.d"
    egl_dir.mkdir(parents=True)
    for json_name, library in EGL_VENDORS.items():
        if (lib_dir / library).exists():
            (egl_dir / json_name).write_text(
                json.dumps({"file_format_version": "1.0.0", "ICD": {"library_path": library}})
            )
    metas = _stage_guests(out, guests)
    if apir:
        _stage_apir(root, out, libs)
    manifest: dict[str, object] = {
        "format": FORMAT,
        "guest": metas[0] if metas else {},
        "guests": {m["stack"]: m for m in metas},
        "host_driver": host_driver,
        "apir": apir,
        "files": hashes(out),
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    log(f"bundle: {len(libs)} libraries, {sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) >> 20} MiB")
    return manifest


def _stage_guests(out: Path, guests: Sequence[Guest]) -> list[dict[str, str]]:
    """Each guest in guest/<stack>/, kernels once in guest/ (the routes' images share the pinned one)."""
    metas = []
    for g in guests:
        (out / GUEST_DIR / g.stack).mkdir(parents=True)
        kernel = out / GUEST_DIR / g.kernel.name
        if kernel.exists() and kernel.read_bytes() != g.kernel.read_bytes():
            raise HostToolsMissing(f"two different kernels named {g.kernel.name} in one bundle",
                                   fix="bundle the stacks one at a time (--stack once)")
        if not kernel.exists():
            shutil.copyfile(g.kernel, kernel)
        meta = {"stack": g.stack, "image": g.image, "image_id": g.image_id, "kernel": g.kernel.name}
        for role, path in (("initrd", g.initrd), ("disk", g.disk)):
            shutil.copyfile(path, out / GUEST_DIR / g.stack / path.name)
            meta[role] = f"{g.stack}/{path.name}"
        metas.append(meta)
    return metas


def _stage_apir(root: Path, out: Path, libs: dict[str, Path]) -> None:
    """The APIR route's virglrenderer (``provision host-tools --apir``, /opt/virgl-apir in the
    chroot) at the same path in the bundle: its library and render server, started through our loader."""
    for rel in APIR_FILES:
        src = _resolve(root, rel)
        if src is None:
            raise HostToolsMissing(f"{rel} is missing in {root}", fix="run `provision host-tools --apir` first")
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith("virgl_render_server"):
            real = f"{REAL}/apir-virgl_render_server"
            shutil.copyfile(src, out / real)
            _write_script(dest, wrapper(real, "render-server", len(PurePosixPath(rel).parts) - 1))
        else:
            shutil.copyfile(src, dest)


def _write_script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def root_disk_for(tools: HostTools, stack: Stack) -> RootDisk | None:
    """The guest disk an installed bundle carries for ``stack`` and these pins (no podman needed)."""
    if not tools.bundle:
        return None
    g = guest(tools.root, stack.name)
    if g is None:
        return None
    if g.image != images.default_tag(images.render_stack(stack, pins_mod.default())):
        return None
    return RootDisk(g.disk, g.kernel, g.initrd, g.image_id)


def guest(root: Path, stack: str | None = None) -> Guest | None:
    """The guest a bundle holds for ``stack`` (default: its first), or None."""
    manifest = json.loads((root / MANIFEST).read_text())
    meta = manifest.get("guests", {}).get(stack) if stack else manifest.get("guest", {})
    if not meta and stack and manifest.get("guest", {}).get("stack") == stack:
        meta = manifest["guest"]  # a bundle made before several guests
    if not meta:
        return None
    g = root / GUEST_DIR
    return Guest(
        meta["stack"], meta["image"], meta["image_id"], g / meta["kernel"], g / meta["initrd"], g / meta["disk"]
    )


def make(
    root: Path,
    out: Path,
    guests: Sequence[Guest],
    *,
    level: int = 10,
    log: Callable[[str], None] | None = None,
    host_driver: bool = False,
    apir: bool = False,
) -> dict[str, object]:
    """Stage the bundle beside ``out``, pack it, remove the staging tree; returns the manifest."""
    log = log or say("host-tools")  # stderr: stdout is for --json
    kind = compression_for(out)  # a bad name fails before minutes of staging
    staging = out.with_name(f".{out.name}.staging-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        manifest = stage(root, staging, guests, log, host_driver=host_driver, apir=apir)
        log(f"bundle: packing {out} ({kind}, level {level})")
        pack(staging, out, level=level)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"bundle: {out} ({out.stat().st_size >> 20} MiB)")
    return manifest
