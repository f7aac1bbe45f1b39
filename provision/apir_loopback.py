"""The APIR route without a VM: test-backend-ops against "[virtgpu] <host device>" in one process.

checks/apir-loopback/virtgpu-loopback.cpp stands in for the frontend's DRM transport and for
virglrenderer's APIR component, so the guest frontend (with our patches) and the host
backend library (libggml-virtgpu-backend + ggml-vulkan, from `provision host-tools --apir`)
exchange exactly the bytes they exchange through QEMU. Built and run in the host-tools
chroot, where the host ggml lives; takes about a minute to build on top of it.

A host-side abort ends the test process here (in a VM it ends the render worker): the
output then stops in the middle of an op's cases, which `apir_ops.parse` reports as not
finished, and the process's exit status says how it died.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import apir_host, apir_ops, catalog, layout, paths, sources
from .adapters.chroot import Chroot

SRC_LLAMA = "/src/llama.cpp"
SRC_LOOPBACK = "/src/loopback"
SRC_PATCHES = "/src/patches"
WORK = "/work"
BIN = f"{WORK}/bin"
FRONTEND_SOURCES = (
    "ggml-backend-buffer.cpp", "ggml-backend.cpp", "ggml-backend-device.cpp", "ggml-backend-reg.cpp",
    "ggml-backend-buffer-type.cpp", "virtgpu-utils.cpp", "virtgpu-forward-device.cpp",
    "virtgpu-forward-buffer-type.cpp", "virtgpu-forward-buffer.cpp", "virtgpu-forward-backend.cpp",
    "apir_cs_ggml-rpc-front.cpp",
)


def loopback_dir() -> Path:
    return layout.data_root() / "checks" / "apir-loopback"


def guest_patches() -> list[str]:
    """The patches the guest image applies (llama-apir-linux), so both builds agree."""
    build = catalog.load().get("llama-apir-linux").build
    assert build is not None, "llama-apir-linux is a source build"
    return [PurePosixPath(p).name for p in build.patches]


def build_script(patches: Sequence[str], lib: PurePosixPath = apir_host.GGML_PREFIX / "lib") -> str:
    """Shell for the chroot: patch a copy of the frontend, build it with the loopback, and
    build test-backend-ops against the host ggml (it needs ggml only, not libllama)."""
    front = f"{WORK}/src/ggml/src/ggml-virtgpu"
    inc = f"-I{WORK}/src/ggml/include -I{WORK}/src/ggml/src"
    lines = [
        "set -eu",
        f"rm -rf {WORK}/src {BIN}/libggml-virtgpu.so && mkdir -p {WORK}/src {BIN} {WORK}/venus",
        f": > {WORK}/venus/venus_hw.h",
        f"cp -r {SRC_LLAMA}/ggml {WORK}/src/ && mkdir -p {WORK}/src/tests",
        f"cp {SRC_LLAMA}/tests/test-backend-ops.cpp {WORK}/src/tests/",
        *(f"patch -d {WORK}/src -p1 --forward --batch -i {SRC_PATCHES}/{shlex.quote(p)}" for p in patches),
        # The backend registry loads libggml-virtgpu.so from the executable's directory and
        # calls its ggml_backend_init (GGML_BACKEND_DL).
        f"g++ -std=c++20 -O1 -g -fPIC -shared -DGGML_BACKEND_DL -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED {inc} "
        f"-I{front} -I{front}/include -I{WORK}/venus -I/usr/include/libdrm "
        + " ".join(f"{front}/{s}" for s in FRONTEND_SOURCES)
        + f" {SRC_LOOPBACK}/virtgpu-loopback.cpp -o {BIN}/libggml-virtgpu.so -L{lib} -lggml-base -Wl,-rpath,{lib}",
        f"g++ -std=c++17 -O1 -g {inc} {SRC_LOOPBACK}/repro-supports-op-gap.cpp -o {BIN}/repro-supports-op-gap "
        f"-L{lib} -lggml-base -Wl,-rpath,{lib}",
        f"test -x {BIN}/test-backend-ops -a {BIN}/test-backend-ops -nt {SRC_LLAMA}/tests/test-backend-ops.cpp "
        f"|| g++ -std=c++17 -O1 {inc} {WORK}/src/tests/test-backend-ops.cpp -o {BIN}/test-backend-ops "
        f"-L{lib} -lggml -lggml-base -lpthread -Wl,-rpath,{lib}",
    ]
    return "\n".join(lines)


def run_env(host: apir_host.ApirHost) -> dict[str, str]:
    """The hypervisor's environment for the backend library, as on the VM route."""
    env = {k: v for k, v in host.qemu_env().items() if k.startswith(("VIRGL_APIR_BACKEND", "APIR_", "GGML_VK"))}
    env["VK_DRIVER_FILES"] = "/usr/share/vulkan/icd.d/lvp_icd.json"
    return env


@dataclass(frozen=True)
class Loopback:
    chroot: Chroot
    env: dict[str, str]

    def test_backend_ops(self, args: Sequence[str], timeout_s: float = 900) -> tuple[int, str]:
        argv = self.chroot.argv([f"{BIN}/test-backend-ops", *args], self.env)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            return 124, out
        return proc.returncode, proc.stdout + proc.stderr


def make(log: Callable[[str], None] | None = None) -> Loopback:
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    host = apir_host.require()
    work = paths.cache_dir("apir-loopback")
    binds = {
        sources.llama_cpp_tree(): SRC_LLAMA,
        loopback_dir(): SRC_LOOPBACK,
        layout.patches_dir() / "llama.cpp": SRC_PATCHES,
        work: WORK,
    }
    chroot = Chroot(host.tools.root, binds)
    proc = subprocess.run(chroot.argv(["sh", "-c", build_script(guest_patches())]), capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        log(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise RuntimeError("building the APIR loopback failed")
    return Loopback(chroot, run_env(host))


def run_ops(lb: Loopback, device: str, ops: Sequence[apir_ops.Op] = apir_ops.LLAMA_OPS) -> dict[str, object]:
    results: dict[str, object] = {}
    for op in ops:
        rc, out = lb.test_backend_ops(apir_ops.tbo_argv(op, device)[1:])
        res = apir_ops.parse(out, op.name, device)
        results[op.name] = {"exit": rc, **res.summary()}
    return results


if __name__ == "__main__":
    lb = make()
    device = sys.argv[1] if len(sys.argv) > 1 else "[virtgpu] Vulkan0"
    print(json.dumps(run_ops(lb, device), indent=2))
