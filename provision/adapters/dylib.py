"""Shared libraries: which symbols a library exports (dlopen + dlsym through ctypes) and
what a Mach-O binary links (``otool -L`` / ``otool -l`` output).

The symbol probe runs in a child Python so a library whose initializers crash, or that
pulls in conflicting dependencies, cannot take the doctor down with it. Optional symbols
(``krun_set_gpu_options2`` exists only in libkrun built with GPU=1) are probed, never assumed.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from provision.adapters import runner


@dataclass(frozen=True)
class SymbolProbe:
    path: str
    loaded: bool
    error: str | None = None
    present: dict[str, bool] = field(default_factory=dict)

    def has(self, symbol: str) -> bool:
        return self.loaded and self.present.get(symbol, False)


def _probe_in_process(path: str, symbols: list[str]) -> dict[str, object]:
    mode = getattr(os, "RTLD_LAZY", 1) | getattr(os, "RTLD_LOCAL", 0)
    try:
        lib = ctypes.CDLL(path, mode=mode)
    except OSError as exc:
        return {"loaded": False, "error": str(exc), "present": {}}
    present = {}
    for sym in symbols:
        try:
            getattr(lib, sym)
            present[sym] = True
        except AttributeError:
            present[sym] = False
    return {"loaded": True, "error": None, "present": present}


def probe_symbols(path: Path | str, symbols: list[str], *, timeout: float = 20.0) -> SymbolProbe:
    """dlopen ``path`` in a child interpreter and report which of ``symbols`` dlsym finds."""
    argv = [sys.executable, "-m", "provision.adapters.dylib", str(path), *symbols]
    proc = runner.run(argv, timeout=timeout)
    if proc.timed_out:
        return SymbolProbe(str(path), False, f"dlopen did not return within {timeout:.0f} s")
    if proc.status != 0 or not proc.out.strip():
        why = (proc.err.strip().splitlines() or [f"probe exited {proc.status}"])[-1]
        return SymbolProbe(str(path), False, f"loading crashed the probe: {why}")
    data = json.loads(proc.out)
    return SymbolProbe(str(path), bool(data["loaded"]), data["error"], dict(data["present"]))


# --- otool ----------------------------------------------------------------------------------


def otool_l_cmd(binary: Path | str) -> list[str]:
    return ["otool", "-L", str(binary)]


def otool_load_commands_cmd(binary: Path | str) -> list[str]:
    return ["otool", "-l", str(binary)]


_LINKED = re.compile(r"^\s+(\S.*?) \(compatibility version [^,]+, current version [^)]+\)\s*$")
_RPATH = re.compile(r"^\s+path (\S.*?) \(offset \d+\)\s*$")


def parse_otool_L(output: str) -> list[str]:
    """Install names from ``otool -L`` (the first line names the binary itself)."""
    return [m.group(1) for line in output.splitlines() if (m := _LINKED.match(line))]


def parse_rpaths(output: str) -> list[str]:
    """LC_RPATH entries from ``otool -l`` (``path X (offset 12)`` lines after ``cmd LC_RPATH``)."""
    rpaths: list[str] = []
    in_rpath = False
    for line in output.splitlines():
        s = line.strip()
        if s.startswith("cmd "):
            in_rpath = s == "cmd LC_RPATH"
        elif in_rpath and (m := _RPATH.match(line)):
            rpaths.append(m.group(1))
    return rpaths


def resolve_install_name(name: str, *, binary: Path, rpaths: list[str]) -> list[Path]:
    """Candidate files dyld would try for an install name (first existing one wins)."""
    exe_dir = binary.parent
    if name.startswith("@executable_path/") or name.startswith("@loader_path/"):
        return [exe_dir / name.split("/", 1)[1]]
    if name.startswith("@rpath/"):
        rest = name.split("/", 1)[1]
        out = []
        for rp in rpaths:
            base = rp.replace("@executable_path", str(exe_dir)).replace("@loader_path", str(exe_dir))
            out.append(Path(base) / rest)
        return out
    return [Path(name)]


def find_linked(installs: list[str], stem: str) -> str | None:
    """The install name whose file name starts with ``stem`` (e.g. ``libvirglrenderer``)."""
    for name in installs:
        if Path(name).name.startswith(stem):
            return name
    return None


if __name__ == "__main__":  # the child side of probe_symbols
    print(json.dumps(_probe_in_process(sys.argv[1], sys.argv[2:])))
