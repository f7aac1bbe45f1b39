"""The few ELF facts a relocatable bundle needs: the libraries a file asks for, and its run paths.

Read from the bytes (no readelf, no ld.so), so a bundle can be made on any host and the
parser is tested on real files. Only 64-bit little-endian files (x86-64) are understood.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 1, 5, 15, 29


@dataclass(frozen=True)
class Dynamic:
    needed: tuple[str, ...]
    runpath: tuple[str, ...]  # DT_RUNPATH, else DT_RPATH, split on ':'
    interpreter: str | None


class NotElf(ValueError):
    pass


def parse(data: bytes) -> Dynamic:
    """DT_NEEDED, run paths and PT_INTERP of one ELF64 LE file (a static file has none)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NotElf("not a 64-bit little-endian ELF file")
    phoff = struct.unpack_from("<Q", data, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []
    dyn: tuple[int, int] | None = None
    interp: str | None = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dyn = (p_offset, p_filesz)
        elif p_type == PT_INTERP:
            interp = data[p_offset : p_offset + p_filesz].split(b"\0", 1)[0].decode()
    if dyn is None:
        return Dynamic((), (), interp)
    entries: list[tuple[int, int]] = []
    for off in range(dyn[0], dyn[0] + dyn[1], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == DT_NULL:
            break
        entries.append((tag, val))
    strtab_vaddr = next((v for t, v in entries if t == DT_STRTAB), None)
    if strtab_vaddr is None:
        raise NotElf("dynamic section without a string table")
    strtab = _file_offset(loads, strtab_vaddr)

    def string(at: int) -> str:
        end = data.index(b"\0", strtab + at)
        return data[strtab + at : end].decode()

    needed = tuple(string(v) for t, v in entries if t == DT_NEEDED)
    run = [string(v) for t, v in entries if t == DT_RUNPATH] or [string(v) for t, v in entries if t == DT_RPATH]
    runpath = tuple(p for r in run for p in r.split(":") if p)
    return Dynamic(needed, runpath, interp)


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    for seg_vaddr, seg_offset, seg_size in loads:
        if seg_vaddr <= vaddr < seg_vaddr + seg_size:
            return vaddr - seg_vaddr + seg_offset
    raise NotElf(f"address {vaddr:#x} lies in no loaded segment")


def read(path: Path) -> Dynamic:
    return parse(path.read_bytes())


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False
