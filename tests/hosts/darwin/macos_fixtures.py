"""Real artifacts for the macOS-route tests: shared libraries compiled here with gcc (with
and without krun_set_gpu_options2), a krun bundle laid out like the flake's, and a running
process named krunkit that maps our "virglrenderer" so lsof has something real to show."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data" / "macos"

GPU_LIBKRUN_C = """
int krun_create_ctx(void) { return 0; }
int krun_set_gpu_options2(unsigned ctx, unsigned flags, unsigned long long shm) { return 0; }
int krun_add_virtiofs4(unsigned ctx, const char *tag, const char *path, unsigned long long s, int ro) { return 0; }
"""
NOGPU_LIBKRUN_C = """
int krun_create_ctx(void) { return 0; }
int krun_add_virtiofs4(unsigned ctx, const char *tag, const char *path, unsigned long long s, int ro) { return 0; }
"""
VIRGL_C = "int virgl_renderer_init(void *c, int f, void *cb) { return 0; }\n"
# A process named krunkit that dlopen()s the library given on its command line, then waits.
KRUNKIT_C = """
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (!dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "%s\\n", dlerror()); return 1; }
    puts("mapped"); fflush(stdout);
    sleep(60);
    return 0;
}
"""


def cc_shared(src: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c)], check=True)
    c.unlink()
    return out


def cc_exe(src: str, out: Path) -> Path:
    c = out.with_name(out.name + ".c")
    c.write_text(src)
    subprocess.run(["gcc", "-o", str(out), str(c), "-ldl"], check=True)
    c.unlink()
    return out


def make_bundle(
    root: Path,
    *,
    gpu: bool = True,
    krunkit_version: str = "1.3.2",
    libkrun_version: str = "1.19.3",
    firmware: bool = True,
    apir: bool = True,
) -> Path:
    (root / "bin").mkdir(parents=True)
    krunkit = root / "bin" / "krunkit"
    # krunkit's clap parser prints "<name> <version>" for --version.
    krunkit.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "krunkit {krunkit_version}" && exit 0\nexit 2\n')
    krunkit.chmod(0o755)
    lib = root / "lib"
    cc_shared(GPU_LIBKRUN_C if gpu else NOGPU_LIBKRUN_C, lib / "libkrun.1.dylib")
    cc_shared(VIRGL_C, lib / "libvirglrenderer.1.dylib")
    if apir:
        cc_shared("int apir_backend_initialize(void) { return 6; }\n", lib / "libggml-virtgpu-backend.dylib")
        cc_shared("void *ggml_backend_metal_reg(void) { return 0; }\n", lib / "libggml-metal.dylib")
    (lib / "pkgconfig").mkdir()
    (lib / "pkgconfig" / "libkrun.pc").write_text(
        f"prefix={root}\nlibdir=${{prefix}}/lib\n\nName: libkrun\nDescription: krun\n"
        f"Version: {libkrun_version}\nLibs: -lkrun\n"
    )
    if firmware:
        (root / "share" / "krunkit").mkdir(parents=True)
        (root / "share" / "krunkit" / "KRUN_EFI.silent.fd").write_bytes(b"\0" * 64)
    return root


class MappedProcess:
    """A real process named ``krunkit`` with ``lib`` mapped; stopped on exit."""

    def __init__(self, workdir: Path, lib: Path) -> None:
        exe = cc_exe(KRUNKIT_C, workdir / "krunkit")
        self.proc = subprocess.Popen([str(exe), str(lib)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        assert line == "mapped", f"helper did not map {lib}"

    def __enter__(self) -> MappedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, 9)


def wait_for(pred, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False
