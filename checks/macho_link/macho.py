"""Reading a Mach-O file's header and symbol table (pure: bytes in, facts out).

zig leaves an empty or partial output when a link fails, so a build is judged by this parse
(64-bit arm64 dylib with a symbol table), never by the file's existence."""

from __future__ import annotations

import struct
from dataclasses import dataclass

MH_MAGIC_64 = 0xFEEDFACF
CPU_TYPE_ARM64 = 0x0100000C
MH_DYLIB = 6
LC_SYMTAB = 0x2
N_EXT = 0x01
N_TYPE = 0x0E
N_SECT = 0x0E
N_UNDF = 0x0
N_STAB = 0xE0


class MachOError(Exception):
    pass


@dataclass(frozen=True)
class MachO:
    cputype: int
    filetype: int
    exported: frozenset[str]
    undefined: frozenset[str]

    @property
    def is_arm64_dylib(self) -> bool:
        return self.cputype == CPU_TYPE_ARM64 and self.filetype == MH_DYLIB


def c_name(symbol: str) -> str:
    """Mach-O prefixes C names with '_'."""
    return symbol[1:] if symbol.startswith("_") else symbol


def parse(data: bytes) -> MachO:
    if len(data) < 32:
        raise MachOError(f"not a Mach-O file: {len(data)} bytes (zig leaves an empty file when a link fails)")
    magic, cputype, _sub, filetype, ncmds, _size, _flags, _res = struct.unpack_from("<IiiIIIII", data, 0)
    if magic != MH_MAGIC_64:
        raise MachOError(f"not a 64-bit little-endian Mach-O file (magic {magic:#x})")
    offset = 32
    exported: set[str] = set()
    undefined: set[str] = set()
    for _ in range(ncmds):
        if offset + 8 > len(data):
            raise MachOError("truncated load commands")
        cmd, cmdsize = struct.unpack_from("<II", data, offset)
        if cmdsize < 8:
            raise MachOError(f"load command {cmd:#x} has size {cmdsize}")
        if cmd == LC_SYMTAB:
            symoff, nsyms, stroff, strsize = struct.unpack_from("<IIII", data, offset + 8)
            if symoff + nsyms * 16 > len(data) or stroff + strsize > len(data):
                raise MachOError("symbol table outside the file")
            strings = data[stroff : stroff + strsize]
            for i in range(nsyms):
                strx, ntype, _nsect, _desc, _value = struct.unpack_from("<IBBHQ", data, symoff + 16 * i)
                if ntype & N_STAB or not ntype & N_EXT:
                    continue
                end = strings.find(b"\0", strx)
                name = c_name(strings[strx : end if end >= 0 else None].decode("utf-8", "replace"))
                if ntype & N_TYPE == N_SECT:
                    exported.add(name)
                elif ntype & N_TYPE == N_UNDF:
                    undefined.add(name)
        offset += cmdsize
    return MachO(cputype, filetype, frozenset(exported), frozenset(undefined))
