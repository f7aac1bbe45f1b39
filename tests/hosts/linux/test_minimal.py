"""Minimal guest disks (hosts/linux/tools/minimal_disk.py): the klibc initrd's contents read back from its cpio, the
prune keeping what the programs load, and the real llama-linux minimal disk booting a Venus guest here."""

from __future__ import annotations

import gzip
import json
import lzma
import re
from pathlib import Path

import pytest

from provision.core import catalog
from provision.core.errors import ImageBuildFailed
from provision.hosts import RunIO, RunRequest
from provision.hosts.linux.run import execute
from provision.hosts.linux.run import facts as linux
from provision.hosts.linux.tools import minimal_disk
from provision.images import disks


def cpio_names(data: bytes) -> dict[str, tuple[int, bytes]]:
    """newc entries: name -> (mode, data)."""
    out, i = {}, 0
    while True:
        head = data[i:i + 110]
        assert head[:6] == b"070701"
        f = [int(head[6 + 8 * k:14 + 8 * k], 16) for k in range(13)]
        mode, size, namesize = f[1], f[6], f[11]
        name = data[i + 110:i + 110 + namesize - 1].decode()
        j = i + 110 + namesize
        j += -j % 4
        if name == "TRAILER!!!":
            return out
        out[name] = (mode, data[j:j + size])
        i = j + size + (-size % 4)


def fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    kdir = root / "usr/lib/modules/7.0-test/kernel"
    for m in minimal_disk.ROOT_MODULES:
        (kdir / m).mkdir(parents=True)
        (kdir / m / f"{m}.ko.xz").write_bytes(lzma.compress(f"module {m}".encode()))
    (root / "usr/lib/klibc-ABC.so").parent.mkdir(parents=True, exist_ok=True)
    (root / "usr/lib/klibc-ABC.so").write_bytes(b"klibc")
    for t in minimal_disk.KLIBC_TOOLS:
        (root / "usr/lib/klibc/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/lib/klibc/bin" / t).write_bytes(t.encode())
    return root


def test_initrd_holds_klibc_at_its_interpreter_path_the_modules_uncompressed_and_an_init(tmp_path: Path) -> None:
    entries = cpio_names(gzip.decompress(minimal_disk.initrd_bytes(fake_root(tmp_path))))
    assert entries["usr/lib/klibc-ABC.so"][1] == b"klibc"  # PT_INTERP of klibc's programs
    assert all(entries[f"bin/{t}"][1] == t.encode() for t in minimal_disk.KLIBC_TOOLS)
    assert entries["lib/modules/ext4.ko"][1] == b"module ext4"  # klibc's insmod cannot read .xz
    init = entries["init"][1].decode()
    assert init.startswith("#!/bin/sh") and entries["init"][0] & 0o111
    assert " ".join(minimal_disk.ROOT_MODULES) in init and "run-init /root" in init
    assert entries["dev/console"][0] & 0o170000 == 0o020000  # a character device: run-init's console


def test_initrd_names_a_missing_module(tmp_path: Path) -> None:
    root = fake_root(tmp_path)
    next((root / "usr/lib/modules").rglob("jbd2.ko.xz")).unlink()
    with pytest.raises(ImageBuildFailed) as err:
        minimal_disk.initrd_bytes(root)
    assert "jbd2" in err.value.message and "boot.modules" in (err.value.fix or "")


@pytest.mark.slow
def test_the_minimal_venus_disk_boots_and_lists_venus_without_lavapipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = catalog.load().get("llama-linux")
    full = linux.root_disk(stack)
    small = minimal_disk.make(full, tmp_path / "min", stack.name)
    meta = json.loads((tmp_path / "min/disk.json").read_text())
    assert small.initrd.stat().st_size < 2 * 2**20 < full.initrd.stat().st_size
    assert meta["root_bytes"] < full.disk.stat().st_blocks * 512 / 2
    monkeypatch.setattr(linux, "root_disk", lambda _stack: small)
    out = tmp_path / "out"
    with out.open("wb") as sink:
        result = execute.run(RunRequest(stack, True, (
            "sh", "-c", "llama-bench --list-devices; ls /usr/lib/x86_64-linux-gnu | grep -c -E 'LLVM|lvp' || true",
        ), timeout_s=900), RunIO(out=sink))
    text = out.read_text()
    assert result.exit_status == 0, text
    assert re.search(r"Vulkan0: Virtio-GPU Venus \(llvmpipe", text), text
    assert text.strip().splitlines()[-1] == "0"  # no libLLVM, no lavapipe in the root
    assert isinstance(small, disks.RootDisk)
