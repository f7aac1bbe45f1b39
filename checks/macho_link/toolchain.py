"""zig as a macOS arm64 cross toolchain for meson, plus the Mach-O stand-ins of what the trees link.

zig (the `ziglang` wheel) ships Apple's libSystem headers and link stubs and a Mach-O linker. The
host's /usr/include is never on the include path (glibc headers would make configure checks lie):
Vulkan and epoxy headers are copied from Debian's -dev packages into a folder of their own.
libepoxy is a stand-in: a Mach-O dylib defining exactly the functions and data symbols that
Debian's libepoxy.so.0 exports (`nm -D --defined-only`), so the link is as strict as the real
library's export list. MoltenVK is not linked (vulkan-dload), so it needs no stand-in."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

TARGET = "aarch64-macos"
DEBIAN_EPOXY = Path("/usr/lib/x86_64-linux-gnu/libepoxy.so.0")
HEADER_DIRS = {
    "vulkan": Path("/usr/include/vulkan"),
    "vk_video": Path("/usr/include/vk_video"),
    "epoxy": Path("/usr/include/epoxy"),
}
EPOXY_VERSION = "1.5.10"


class ToolchainError(Exception):
    pass


def run(cmd: list[str], cwd: Path | None = None, log: Path | None = None, timeout: int = 1200) -> int:
    if log is None:
        return subprocess.run(cmd, cwd=cwd, timeout=timeout).returncode
    with log.open("ab") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode


def zig_version() -> str:
    proc = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(
            "zig is not installed in this Python\nfix: pip install ziglang (pyproject.toml, extra `test`)"
        )
    return proc.stdout.strip()


def inputs_key() -> str:
    """What a cached result depends on besides the pin: zig and the Debian files the stand-ins copy."""
    h = hashlib.sha256(zig_version().encode())
    for path in (DEBIAN_EPOXY, HEADER_DIRS["vulkan"] / "vulkan_core.h"):
        h.update(path.read_bytes() if path.exists() else b"missing")
    return h.hexdigest()


def meson() -> str:
    """meson from the same environment (the pyproject `test` extra), else the PATH's."""
    beside = Path(sys.executable).parent / "meson"
    found = str(beside) if beside.exists() else shutil.which("meson")
    if not found:
        raise ToolchainError("meson not found\nfix: pip install meson (pyproject.toml, extra `test`)")
    return found


def wrappers(root: Path) -> dict[str, Path]:
    """Executables meson can call: `python -m ziglang cc|c++|ar|ranlib`."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for tool in ("cc", "c++", "ar", "ranlib"):
        path = root / f"zig-{tool}"
        path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ziglang {tool} "$@"\n')
        path.chmod(0o755)
        out[tool] = path
    return out


def meson_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cross_file(root: Path, tools: dict[str, Path], prefix: Path) -> Path:
    include = prefix / "include"
    text = f"""[binaries]
c = [{meson_quote(str(tools["cc"]))}, '-target', '{TARGET}']
cpp = [{meson_quote(str(tools["c++"]))}, '-target', '{TARGET}']
ar = {meson_quote(str(tools["ar"]))}
ranlib = {meson_quote(str(tools["ranlib"]))}
pkg-config = 'pkg-config'

[properties]
pkg_config_libdir = {meson_quote(str(prefix / "lib" / "pkgconfig"))}

[built-in options]
c_args = [{meson_quote("-I" + str(include))}]
cpp_args = [{meson_quote("-I" + str(include))}]

[host_machine]
system = 'darwin'
subsystem = 'macos'
kernel = 'xnu'
cpu_family = 'aarch64'
cpu = 'arm64'
endian = 'little'
"""
    path = root / "cross-aarch64-macos.ini"
    path.write_text(text)
    return path


# Headers Apple's SDK has and zig's macOS libc headers lack. Each stand-in declares nothing, so a
# tree that uses what the real header defines still fails to compile (a gap is never a pass).
SDK_HEADER_GAPS = {
    # The SDK's defines only the SYS_* numbers (syscall() itself is in unistd.h); vtest_shm.c
    # includes it and tests only Linux's __NR_memfd_create.
    "sys/syscall.h": "/* stand-in for the macOS SDK's <sys/syscall.h>, absent from zig's headers */\n",
}


def sdk_header_gaps(include: Path) -> None:
    for rel, text in SDK_HEADER_GAPS.items():
        path = include / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def debian_exports(library: Path) -> tuple[list[str], list[str]]:
    """(functions, data symbols) a Debian shared library defines."""
    if not library.exists():
        raise ToolchainError(f"{library} missing\nfix: apt-get install libepoxy-dev (scripts/setup-debian)")
    proc = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    functions, data = [], []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 3 or "@" in parts[2]:
            continue
        kind, name = parts[1], parts[2]
        if kind in ("T", "W", "i"):
            functions.append(name)
        elif kind in ("D", "B", "R", "V"):
            data.append(name)
    if not functions:
        raise ToolchainError(f"{library}: no exported functions read by nm")
    return sorted(functions), sorted(data)


def epoxy_standin(prefix: Path, tools: dict[str, Path], log: Path) -> Path:
    """libepoxy.0.dylib with Debian's export list, its headers and an epoxy.pc (no EGL/GLX, as on macOS)."""
    functions, data = debian_exports(DEBIAN_EPOXY)
    (prefix / "lib" / "pkgconfig").mkdir(parents=True, exist_ok=True)
    include = prefix / "include"
    for name, src in HEADER_DIRS.items():
        if not src.is_dir():
            raise ToolchainError(
                f"{src} missing\nfix: apt-get install libvulkan-dev libepoxy-dev (scripts/setup-debian)"
            )
        shutil.copytree(src, include / name, dirs_exist_ok=True)
    source = prefix / "epoxy-standin.c"
    source.write_text(
        "/* Mach-O stand-in: the symbols of Debian's libepoxy.so.0, no behaviour. */\n"
        + "".join(f"void {f}(void);\nvoid {f}(void) {{}}\n" for f in functions)
        + "".join(f"void *{d} = 0;\n" for d in data)
    )
    dylib = prefix / "lib" / "libepoxy.0.dylib"
    rc = run(
        [
            str(tools["cc"]),
            "-target",
            TARGET,
            "-shared",
            "-o",
            str(dylib),
            "-Wl,-install_name,@rpath/libepoxy.0.dylib",
            str(source),
        ],
        log=log,
    )
    if rc != 0:
        raise ToolchainError(f"building the libepoxy stand-in failed (rc {rc}); see {log}")
    link = prefix / "lib" / "libepoxy.dylib"
    link.unlink(missing_ok=True)
    link.symlink_to(dylib.name)
    (prefix / "lib" / "pkgconfig" / "epoxy.pc").write_text(
        f"prefix={prefix}\nlibdir=${{prefix}}/lib\nincludedir=${{prefix}}/include\n"
        "epoxy_has_glx=0\nepoxy_has_egl=0\nepoxy_has_wgl=0\n\n"
        f"Name: epoxy\nDescription: Mach-O stand-in with Debian's libepoxy export list\nVersion: {EPOXY_VERSION}\n"
        "Cflags: -I${includedir}\nLibs: -L${libdir} -lepoxy\n"
    )
    return dylib
