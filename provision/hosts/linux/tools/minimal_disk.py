"""A minimal guest disk per route, small enough to carry: the stack's VM disk cut to what runs.

The full VM disk (provision/images/disks.py) is the image's whole root (a Debian install: apt, perl, every Mesa
Vulkan driver with LLVM behind lavapipe) and initramfs-tools' initrd (40 MB, udev and all). A
GPU machine reached by copying files wants neither. This keeps, of the same pinned image:
- the root's programs (bin, sbin, libexec: llama-bench, test-backend-ops, the init's tools) and
  the shared libraries they, ggml's backends and Mesa's virtio Vulkan driver load (the ELF
  closure, bundle.closure); every other library, every other Vulkan driver (lavapipe included,
  so LLVM goes too), and documentation, locales, apt and perl are removed;
- a new initrd of a few hundred KiB: klibc's sh, insmod, mount and run-init (klibc-utils is in
  every VM stack) and, uncompressed, only the modules that mount the root (virtio_blk, ext4 and
  what ext4 needs); its /init mounts /dev/vda read-only and runs the kernel's ``init=``.
The kernel is the image's own; the root keeps the modules the guest init loads (the image's
boot stage already cut /lib/modules to those).
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import stat
import zlib
from collections.abc import Iterable
from pathlib import Path

from provision.adapters import elf, runner
from provision.core.errors import ImageBuildFailed
from provision.hosts.linux.tools import bundle
from provision.images.disks import RootDisk, _mkfs

LIB = bundle.LIB
# The Vulkan driver a Venus guest uses; every other ICD (and lavapipe's LLVM) leaves.
VENUS_ICD = "virtio_icd.json"
DLOPENED = (f"{LIB}/libvulkan_virtio.so", f"{LIB}/ggml/backends0/*.so", f"{LIB}/libvulkan.so.1")
JUNK = (
    "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/i18n",
    "usr/share/zoneinfo", "usr/share/X11", "usr/share/lintian", "usr/share/bug", "usr/share/perl5",
    "usr/share/llama.cpp", "usr/lib/x86_64-linux-gnu/perl-base", "usr/lib/x86_64-linux-gnu/gconv",
    "usr/share/vulkan/explicit_layer.d", "usr/share/vulkan/implicit_layer.d", "var/cache", "var/lib/apt",
    "var/log", "usr/lib/x86_64-linux-gnu/dri", "usr/share/drirc.d", "boot",
)
GLIBC_LIB = re.compile(r"^(libc|libm|libmvec|libdl|libpthread|librt|libutil|libresolv|libanl|libnss_\w+)\.so")
PROGRAM_DIRS = ("usr/bin", "usr/sbin", "usr/libexec", "usr/lib/klibc/bin", "usr/local")
# The programs a job runs (the bench, the op tests, the checks' shell) and the guest init's tools;
# every other ELF program in PROGRAM_DIRS goes. Scripts stay (they load nothing).
KEEP_PROGRAMS = frozenset((
    "llama-bench", "test-backend-ops", "llama-cli", "llama-simple", "vulkaninfo",
    "sh", "dash", "bash", "mount", "umount", "kmod", "modprobe", "insmod", "lsmod", "dmesg",
    "cat", "cut", "tr", "grep", "sed", "mawk", "awk", "sleep", "sync", "ls", "head", "tail", "env", "timeout",
    "mkdir", "rm", "cp", "mv", "ln", "test", "[", "echo", "printf", "date", "uname", "id", "wc", "sort", "uniq",
    "dd", "df", "du", "stat", "true", "false", "basename", "dirname", "readlink", "kill", "nproc", "tee", "seq",
    "expr", "xargs", "find", "chmod", "touch", "md5sum", "sha256sum", "ipconfig", "run-init", "free", "ps",
))
# The root file system's drivers, in load order (modules.dep: ext4 needs crc16, mbcache, jbd2; crc32c).
ROOT_MODULES = ("virtio_blk", "crc16", "mbcache", "jbd2", "crc32c-cryptoapi", "ext4")
KLIBC_TOOLS = ("sh", "insmod", "mount", "umount", "run-init", "sleep", "mkdir", "cat")
INITRD_INIT = """#!/bin/sh
# krun-gpu minimal initrd: load the root disk's drivers, mount it read-only, run the kernel's init=.
mkdir -p /proc /sys /dev /root
mount -t proc proc /proc
mount -t devtmpfs dev /dev
for m in {modules}; do insmod /lib/modules/$m.ko; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
mount -t ext4 -o ro /dev/vda /root || {{ echo "krun-gpu initrd: cannot mount /dev/vda"; sleep 2; exit 1; }}
init=/sbin/init
for a in $(cat /proc/cmdline); do case "$a" in init=*) init=${{a#init=}} ;; esac; done
umount /dev
umount /proc
# run-init opens the new root's /dev/console: the real init mounts its own devtmpfs over this one.
mount -t devtmpfs dev /root/dev
exec run-init /root "$init"
"""


def _debugfs_dump(disk: Path, dest: Path) -> None:
    runner.which("debugfs", fix="apt-get install e2fsprogs (scripts/setup-debian does)")
    dest.mkdir(parents=True)
    done = runner.run(["debugfs", "-R", f"rdump / {dest}", str(disk)], timeout=600)
    if not done.ok or not (dest / "usr").is_dir():
        raise ImageBuildFailed(f"debugfs rdump of {disk} failed: {done.err.strip()[-600:]}")


def _elf_files(root: Path, dirs: Iterable[str]) -> list[str]:
    out = []
    for d in dirs:
        for p in sorted((root / d).rglob("*")) if (root / d).is_dir() else []:
            if p.is_file() and not p.is_symlink() and elf.is_elf(p):
                out.append(str(p.relative_to(root)))
    return out


def prune(root: Path, programs: frozenset[str] = KEEP_PROGRAMS) -> dict[str, int]:
    """Cut the unpacked root at ``root`` to ``programs`` and what they load; returns counts."""
    removed = 0
    for rel in JUNK:
        if (root / rel).exists():
            shutil.rmtree(root / rel)
            removed += 1
    icd_dir = root / "usr/share/vulkan/icd.d"
    for icd in icd_dir.glob("*.json") if icd_dir.is_dir() else []:
        if icd.name != VENUS_ICD:
            icd.unlink()
    libdir = root / LIB
    for so in libdir.glob("libvulkan_*.so"):
        if so.name != "libvulkan_virtio.so":
            so.unlink()
    for layer in libdir.glob("libVkLayer_*"):
        layer.unlink()
    starts = []
    for rel in _elf_files(root, PROGRAM_DIRS):
        if Path(rel).name in programs or rel.startswith("usr/lib/klibc/"):
            starts.append(rel)
        else:
            (root / rel).unlink()
            removed += 1
    for link in [p for d in PROGRAM_DIRS for p in (root / d).rglob("*") if p.is_symlink() and not p.exists()]:
        link.unlink()
    for pattern in DLOPENED:
        starts += [str(p.relative_to(root)) for p in sorted(root.glob(pattern))]
    needed = {p.resolve() for p in bundle.closure(root, starts).values()}
    needed |= {(root / s).resolve() for s in starts}
    kept = dropped = 0
    for p in sorted(libdir.rglob("*.so*")):
        if p.is_symlink() or not p.is_file():
            continue
        # glibc's own libraries stay: a driver loaded from outside the root (a host's GPU driver run
        # against this root) may name libdl or libpthread though nothing here does.
        if GLIBC_LIB.match(p.name) or p.resolve() in needed or not elf.is_elf(p):
            kept += 1
        else:
            p.unlink()
            dropped += 1
    for link in [p for p in libdir.rglob("*") if p.is_symlink() and not p.exists()]:
        link.unlink()
    return {"libraries_kept": kept, "libraries_removed": dropped, "programs_and_trees_removed": removed}


def _cpio_entry(name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0), ino: int = 0) -> bytes:
    fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
    head = b"070701" + b"".join(f"{v:08X}".encode() for v in fields) + name.encode() + b"\0"
    head += b"\0" * (-len(head) % 4)
    return head + data + b"\0" * (-len(data) % 4)


def initrd_bytes(root: Path, modules: Iterable[str] = ROOT_MODULES) -> bytes:
    """A gzip'd newc cpio: klibc's tools, the root's drivers (decompressed), /init."""
    kdirs = sorted((root / "usr/lib/modules").iterdir()) if (root / "usr/lib/modules").is_dir() else []
    if len(kdirs) != 1:
        raise ImageBuildFailed(f"expected one kernel's modules in {root}/usr/lib/modules, found {len(kdirs)}")
    found = {p.name.split(".ko")[0]: p for p in kdirs[0].rglob("*.ko*")}
    missing = [m for m in modules if m not in found]
    if missing:
        raise ImageBuildFailed(f"modules {', '.join(missing)} are not in {kdirs[0]}",
                               fix="add them to the stack's boot.modules in provision/data/stacks.yaml")
    klibc = sorted((root / "usr/lib").glob("klibc-*.so"))
    if not klibc or not all((root / "usr/lib/klibc/bin" / t).is_file() for t in KLIBC_TOOLS):
        raise ImageBuildFailed(f"klibc is missing in {root}", fix="add klibc-utils to the stack's packages")
    entries = [("dev", stat.S_IFDIR | 0o755, b""), ("lib", stat.S_IFDIR | 0o755, b""),
               ("lib/modules", stat.S_IFDIR | 0o755, b""), ("bin", stat.S_IFDIR | 0o755, b""),
               ("proc", stat.S_IFDIR | 0o755, b""), ("root", stat.S_IFDIR | 0o755, b""),
               ("usr", stat.S_IFDIR | 0o755, b""), ("usr/lib", stat.S_IFDIR | 0o755, b"")]
    # klibc's programs name their interpreter by this path (PT_INTERP /usr/lib/klibc-<hash>.so).
    entries.append((f"usr/lib/{klibc[0].name}", stat.S_IFREG | 0o755, klibc[0].read_bytes()))
    for t in KLIBC_TOOLS:
        entries.append((f"bin/{t}", stat.S_IFREG | 0o755, (root / "usr/lib/klibc/bin" / t).read_bytes()))
    for m in modules:
        data = found[m].read_bytes()
        data = lzma.decompress(data) if found[m].name.endswith(".xz") else data
        entries.append((f"lib/modules/{m}.ko", stat.S_IFREG | 0o644, data))
    init = INITRD_INIT.format(modules=" ".join(modules))
    entries.append(("init", stat.S_IFREG | 0o755, init.encode()))
    out = b"".join(_cpio_entry(n, mode, d, ino=i + 1) for i, (n, mode, d) in enumerate(entries))
    out += _cpio_entry("dev/console", stat.S_IFCHR | 0o600, rdev=(5, 1), ino=len(entries) + 1)
    out += _cpio_entry("TRAILER!!!", 0)
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing: the kernel's initramfs decompressor
    return z.compress(out) + z.flush()


def make(full: RootDisk, out_dir: Path, stack: str, programs: frozenset[str] = KEEP_PROGRAMS) -> RootDisk:
    """The minimal disk of ``full`` in ``out_dir`` (root.img, the kernel, initrd.img, disk.json)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tree = out_dir / "tree"
    _debugfs_dump(full.disk, tree)
    counts = prune(tree, programs)
    (out_dir / "initrd.img").write_bytes(initrd_bytes(tree))
    shutil.copy2(full.kernel, out_dir / full.kernel.name)
    _mkfs(tree, out_dir / "root.img", "root", extra_mib=16)
    shutil.rmtree(tree)
    meta = {"stack": stack, "image_id": full.image_id, "kernel": full.kernel.name, "initrd": "initrd.img",
            "root_bytes": (out_dir / "root.img").stat().st_blocks * 512, **counts}
    tmp = out_dir / "disk.json.partial"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True))
    os.replace(tmp, out_dir / "disk.json")
    return RootDisk(out_dir / "root.img", out_dir / full.kernel.name, out_dir / "initrd.img", full.image_id)
