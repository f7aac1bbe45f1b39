"""Disks for the Linux route's VMs: the stack's root disk, the model disk, the job disk.

The root disk is the podman image's rootfs (exported) plus provision's guest init,
turned into ext4 with ``mkfs.ext4 -d`` and cached under the image id and the init's
hash, so images stay generic and an unchanged image is never re-exported. Kernel and
initrd come from the rootfs's /boot. Everything is built beside its final name and
renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from provision.adapters import partials, runner
from provision.core import locks
from provision.core.errors import ImageBuildFailed
from provision.core.paths import cache_dir
from provision.images import build as images

INIT_IN_GUEST = "usr/local/libexec/krun-gpu/init"
MODEL_MOUNT = "/models"
SECTOR = 512
# The kernel probes partition tables on every disk; below a few KiB it logs read errors.
JOB_DISK_MIN = 64 * 1024


def init_script() -> bytes:
    return (resources.files("provision") / "data" / "guest" / "init").read_bytes()


@dataclass(frozen=True)
class RootDisk:
    disk: Path
    kernel: Path
    initrd: Path
    image_id: str

    @property
    def directory(self) -> Path:
        return self.disk.parent


def _mkfs(source_dir: Path, dest: Path, label: str, extra_mib: int = 64) -> None:
    runner.which("mkfs.ext4", fix="apt-get install e2fsprogs (scripts/setup-debian does)")
    du = runner.run(["du", "-sb", str(source_dir)])
    if du.status != 0:
        raise ImageBuildFailed(f"du -sb {source_dir} failed: {du.err.strip()[-400:]}")
    used = int(du.out.split()[0])
    # ext4 metadata and block rounding of many small files need room beyond `du`.
    size_mib = int(used * 1.3 / 2**20) + extra_mib
    done = runner.run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-L",
            label,
            "-E",
            "root_owner=0:0",
            "-d",
            str(source_dir),
            str(dest),
            f"{size_mib}M",
        ],
    )
    if done.status != 0:
        raise ImageBuildFailed(f"mkfs.ext4 -d {source_dir} {dest} failed: {done.err.strip()[-800:]}")


def _boot_files(rootfs: Path) -> tuple[Path, Path]:
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    initrds = sorted((rootfs / "boot").glob("initrd.img-*"))
    if not kernels or not initrds:
        raise ImageBuildFailed(
            f"{rootfs}/boot has no vmlinuz-*/initrd.img-* "
            f"(kernels: {[k.name for k in kernels]}, initrds: {[i.name for i in initrds]})",
            fix="give the stack a boot section in provision/data/stacks.yaml "
            "(boot.packages: [linux-image-amd64, initramfs-tools, kmod, udev])",
        )
    return kernels[-1], initrds[-1]


def root_disk(image_ref: str, image_id: str) -> RootDisk:
    """The cached VM disk for an image (keyed by image id + guest init)."""
    init = init_script()
    key = f"{image_id[:16]}-{hashlib.sha256(init).hexdigest()[:12]}"
    final = cache_dir("vm-disks") / key
    done = final / "disk.json"
    if done.is_file():
        meta = json.loads(done.read_text())
        return RootDisk(final / "root.img", final / meta["kernel"], final / meta["initrd"], image_id)
    with locks.held(str(final) + ".lock"):
        if done.is_file():
            return root_disk(image_ref, image_id)
        # Left by a killed export: never used (no disk.json), removed and made again.
        partial = final.with_name(key + ".partial")
        partials.remove(partial)
        partial.mkdir(parents=True)
        rootfs = images.export_rootfs(image_ref, partial / "rootfs")
        target = rootfs / INIT_IN_GUEST
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(init)
        target.chmod(0o755)
        (rootfs / MODEL_MOUNT.lstrip("/")).mkdir(exist_ok=True)
        kernel, initrd = _boot_files(rootfs)
        shutil.copy2(kernel, partial / kernel.name)
        shutil.copy2(initrd, partial / initrd.name)
        _mkfs(rootfs, partial / "root.img", "root", extra_mib=256)
        shutil.rmtree(rootfs)
        (partial / "disk.json").write_text(
            json.dumps({"image": image_ref, "image_id": image_id, "kernel": kernel.name, "initrd": initrd.name})
        )
        partials.remove(final)  # a final without disk.json is half-removed, not whole
        partial.rename(final)
    _prune_disks(keep=final)
    return root_disk(image_ref, image_id)


def made_disk(folder: Path, image_ref: str) -> RootDisk | None:
    """The newest disk ``root_disk`` already made in ``folder`` for ``image_ref`` and this guest init,
    found by reading only (a dry run)."""
    init = hashlib.sha256(init_script()).hexdigest()[:12]
    found = []
    for done in folder.glob(f"*-{init}/disk.json") if folder.is_dir() else []:
        try:
            meta = json.loads(done.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("image") == image_ref:
            found.append((done.stat().st_mtime, done.parent, meta))
    if not found:
        return None
    _, final, meta = max(found, key=lambda f: f[0])
    return RootDisk(final / "root.img", final / meta["kernel"], final / meta["initrd"], str(meta["image_id"]))


KEEP_DISKS = 4


def _prune_disks(keep: Path) -> None:
    """Old root disks (other images, older inits) are 1-2 GB each: keep the newest few."""
    dated = []
    for d in cache_dir("vm-disks").iterdir():
        try:  # another provision may prune the same disk at this moment
            if d.is_dir() and (d / "disk.json").is_file() and d != keep:
                dated.append((d.stat().st_mtime, d))
        except OSError:
            continue
    disks = [d for _, d in sorted(dated, reverse=True)]
    for old in disks[KEEP_DISKS - 1 :]:
        with locks.held(str(old) + ".lock"):
            shutil.rmtree(old, ignore_errors=True)


def guest_model_name(model: Path, name: str | None = None) -> str:
    """The file name the guest sees under /models (store blobs are named by hash)."""
    if name:
        return name if name.endswith(".gguf") else f"{name}.gguf"
    return model.name if model.name.endswith(".gguf") else "model.gguf"


def model_disk(model: Path, guest_name: str, extra: Mapping[str, Path] | None = None) -> Path:
    """A small read-only ext4 disk holding the model as ``guest_name`` (cached by path, size, mtime),
    and ``extra`` files beside it under their given names (`provision perplexity`'s text)."""
    files = {guest_name: model.resolve(), **{name: p.resolve() for name, p in (extra or {}).items()}}
    ident = "\0".join(f"{p}\0{p.stat().st_size}\0{p.stat().st_mtime_ns}\0{name}" for name, p in files.items())
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    final = cache_dir("model-disks") / f"{key}.img"
    if final.is_file():
        return final
    with locks.held(str(final) + ".lock"):
        if final.is_file():
            return final
        staging = final.with_suffix(".staging")
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        try:
            for name, source in files.items():
                try:
                    os.link(source, staging / name)
                except OSError:
                    shutil.copy2(source, staging / name)
            partial = final.with_suffix(".partial")
            _mkfs(staging, partial, "models", extra_mib=16)
            partial.rename(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def write_job_disk(script: str, dest: Path) -> Path:
    """The job script as a raw disk: the text, NUL-padded to whole sectors (init strips NULs)."""
    data = script.encode()
    if b"\0" in data:
        raise ValueError("job script contains a NUL byte")
    size = max(JOB_DISK_MIN, len(data) + SECTOR)
    size += (-size) % SECTOR
    dest.write_bytes(data + b"\0" * (size - len(data)))
    return dest
