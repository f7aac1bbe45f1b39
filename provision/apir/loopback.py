"""The APIR route without a VM: test-backend-ops against "[virtgpu] <host device>" in one process.

checks/apir-loopback/virtgpu-loopback.cpp stands in for the frontend's DRM transport and for
virglrenderer's APIR component, so the guest frontend (with our patches) and the host
backend library (libggml-virtgpu-backend + ggml-vulkan, from `provision host-tools --apir`)
exchange exactly the bytes they exchange through QEMU. Built and run in the host-tools
chroot, where the host ggml lives; takes about a minute to build on top of it.

A host-side abort ends the test process here (in a VM it ends the render worker): the
output then stops in the middle of an op's cases, which `apir.ops.parse` reports as not
finished, and the process's exit status says how it died.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters.chroot import Chroot
from provision.apir import host as apir_host
from provision.apir import ops as apir_ops
from provision.apir import route as apir_route
from provision.core import catalog, layout, paths
from provision.core.errors import HostToolsMissing
from provision.hosts.linux import tools as host_tools
from provision.images import sources

SRC_LLAMA = "/src/llama.cpp"
SRC_LOOPBACK = "/src/loopback"
SRC_PATCHES = "/src/patches"
WORK = "/work"
BIN = f"{WORK}/bin"
BACKEND_SOURCES = (
    "backend.cpp", "backend-dispatched.cpp", "backend-dispatched-backend.cpp", "backend-dispatched-device.cpp",
    "backend-dispatched-buffer.cpp", "backend-dispatched-buffer-type.cpp", "apir_cs_ggml-rpc-back.cpp",
)
# Host-side fixes: applied to the backend library the loopback builds (the guest image does not
# build the backend, so they are not in its stack).
HOST_PATCHES = ("0003-ggml-virtgpu-backend-free-buffers-through-ggml.patch",)
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


def build_script(patches: Sequence[str], target: str = "vulkan",
                 lib: PurePosixPath = apir_host.GGML_PREFIX / "lib") -> str:
    """Shell for the chroot: patch a copy of the frontend, build it with the loopback, and
    build test-backend-ops against the host ggml (it needs ggml only, not libllama). The
    backend registry (libggml.so) is built here with just the CPU backend and the target, so
    the CPU target needs no Vulkan build."""
    front = f"{WORK}/src/ggml/src/ggml-virtgpu"
    inc = f"-I{WORK}/src/ggml/include -I{WORK}/src/ggml/src"
    uses = "-DGGML_USE_CPU" + (" -DGGML_USE_VULKAN" if target == "vulkan" else "")
    links = "-lggml-cpu" + (" -lggml-vulkan" if target == "vulkan" else "")
    rpath = f"-Wl,-rpath,{BIN}:{lib}"
    lines = [
        "set -eu",
        f"rm -rf {WORK}/src {BIN}/libggml-virtgpu.so && mkdir -p {WORK}/src {BIN} {WORK}/venus",
        f": > {WORK}/venus/venus_hw.h",
        f"cp -r {SRC_LLAMA}/ggml {WORK}/src/ && mkdir -p {WORK}/src/tests",
        f"cp {SRC_LLAMA}/tests/test-backend-ops.cpp {WORK}/src/tests/",
        *(f"patch -d {WORK}/src -p1 --forward --batch -i {SRC_PATCHES}/{shlex.quote(p)}"
          for p in [*patches, *HOST_PATCHES]),
        # The host library, from the same patched tree (the host-tools one is unpatched).
        f"g++ -std=c++20 -O1 -g -fPIC -shared -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED {inc} -I{front}/.. "
        + " ".join(f"{front}/backend/{s}" for s in BACKEND_SOURCES)
        + f" -o {BIN}/libggml-virtgpu-backend.so -L{lib} -lggml-base {rpath}",
        # The backend registry loads libggml-virtgpu.so from the executable's directory and
        # calls its ggml_backend_init (GGML_BACKEND_DL).
        f"g++ -std=c++20 -O1 -g -fPIC -shared -DGGML_BACKEND_DL -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED {inc} "
        f"-I{front} -I{front}/include -I{WORK}/venus -I/usr/include/libdrm "
        + " ".join(f"{front}/{s}" for s in FRONTEND_SOURCES)
        + f" {SRC_LOOPBACK}/virtgpu-loopback.cpp -o {BIN}/libggml-virtgpu.so -L{lib} -lggml-base -Wl,-rpath,{lib}",
        f"g++ -std=c++17 -O1 -g {inc} {SRC_LOOPBACK}/repro-supports-op-gap.cpp -o {BIN}/repro-supports-op-gap "
        f"-L{lib} -lggml-base -Wl,-rpath,{lib}",
        f"g++ -std=c++17 -O1 -fPIC -shared {uses} -DGGML_BUILD -DGGML_SHARED {inc} "
        f"{WORK}/src/ggml/src/ggml-backend-reg.cpp {WORK}/src/ggml/src/ggml-backend-dl.cpp "
        f"-o {BIN}/libggml.so -L{lib} -lggml-base {links} {rpath}",
        # The test program is one large file that does not change with our patches: compile once.
        f"test -f {WORK}/test-backend-ops.o || g++ -std=c++17 -O1 -c {inc} {WORK}/src/tests/test-backend-ops.cpp "
        f"-o {WORK}/test-backend-ops.o",
        f"g++ {WORK}/test-backend-ops.o -o {BIN}/test-backend-ops -L{BIN} -L{lib} -lggml -lggml-base -lpthread {rpath}",
    ]
    return "\n".join(lines)


# The host ggml the backend library loads: the route's Vulkan backend, or the CPU backend
# (cheaper to build; the remote device then has type CPU, which test-backend-ops accepts
# when named with -b, while llama's tools would hide it).
TARGETS = {
    "vulkan": ("libggml-vulkan.so", apir_route.KNOWN_REGS["vulkan"], "[virtgpu] Vulkan0"),
    "cpu": ("libggml-cpu.so", apir_route.KNOWN_REGS["cpu"], "[virtgpu] CPU"),
    # An NVIDIA host (checks/apir-cuda, outside the chroot): the remote device is CUDA0.
    "cuda": ("libggml-cuda.so", apir_route.KNOWN_REGS["cuda"], "[virtgpu] CUDA0"),
}


def run_env(target: str, lib: PurePosixPath = apir_host.GGML_PREFIX / "lib") -> dict[str, str]:
    """The hypervisor's environment for the backend library, as on the VM route."""
    library, reg, _device = TARGETS[target]
    return {
        "VIRGL_APIR_BACKEND_LIBRARY": f"{BIN}/libggml-virtgpu-backend.so",
        "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": str(lib / library),
        "APIR_LLAMA_CPP_GGML_LIBRARY_REG": reg,
        # lavapipe is a CPU-type Vulkan device, which ggml-vulkan hides unless listed.
        "GGML_VK_VISIBLE_DEVICES": "0",
        "VK_DRIVER_FILES": "/usr/share/vulkan/icd.d/lvp_icd.json",
    }


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


def make(target: str = "vulkan", log: Callable[[str], None] | None = None, *, build: bool = True) -> Loopback:
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    tools = host_tools.locate()
    lib = apir_host.GGML_PREFIX / "lib"
    needed = [lib / "libggml-base.so", lib / TARGETS[target][0]]
    if tools is None or not tools.is_chroot or not all((tools.root / str(p).lstrip("/")).exists() for p in needed):
        raise HostToolsMissing(
            f"the APIR loopback needs the host ggml ({', '.join(p.name for p in needed)}) in the host-tools chroot",
            fix="run `provision host-tools --apir` (with --virgl-src DIR where the pinned tree cannot be fetched)",
        )
    work = paths.cache_dir("apir-loopback")
    binds = {
        sources.llama_cpp_tree(): SRC_LLAMA,
        loopback_dir(): SRC_LOOPBACK,
        layout.patches_dir() / "llama.cpp": SRC_PATCHES,
        work: WORK,
    }
    chroot = Chroot(tools.root, binds)
    if not build and (work / "bin" / "test-backend-ops").exists():
        return Loopback(chroot, run_env(target, lib))
    proc = subprocess.run(chroot.argv(["sh", "-c", build_script(guest_patches(), target, lib)]), capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        raise HostToolsMissing(
            "building the APIR loopback failed: " + (proc.stdout + proc.stderr)[-1500:],
            fix="see the compiler output above; the host ggml and the pinned tree must be the same version",
        )
    return Loopback(chroot, run_env(target, lib))


def run_ops(lb: Loopback, device: str, ops: Sequence[apir_ops.Op] = apir_ops.LLAMA_OPS) -> dict[str, object]:
    """Each op in its own process: a host abort ends that op's run only, and shows in its exit."""
    results: dict[str, object] = {}
    for op in ops:
        rc, out = lb.test_backend_ops(apir_ops.tbo_argv(op, device)[1:])
        res = apir_ops.parse(out, op.name, device)
        results[op.name] = {"exit": rc, **res.summary(), "ok": res.ok and rc == 0}
    return results


def markdown(target: str, results: dict[str, object]) -> str:
    device = TARGETS[target][2]
    lines = [
        f"# APIR loopback: the llama op list on {device}, without a VM",
        "",
        "Guest frontend (pinned llama.cpp + patches/llama.cpp/*) and host libggml-virtgpu-backend in one process, "
        "joined by checks/apir-loopback/virtgpu-loopback.cpp (no QEMU, no virglrenderer); host ggml target: "
        f"{TARGETS[target][0]}. Command: `python -m provision.apir.loopback --target {target}`.",
        "",
        f"| op | cases run on {device} | passed | refused (run elsewhere) | exit | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        assert isinstance(r, dict)
        lines.append(f"| {name} | {r['ran']} | {r['passed']} | {r['unsupported']} | {r['exit']} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="test-backend-ops on the APIR device, without a VM")
    ap.add_argument("--target", choices=sorted(TARGETS), default="vulkan")
    ap.add_argument("--op", action="append", help="only these ops (default: the llama op list)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--md", type=Path, help="write a markdown report here (bench/results/)")
    ap.add_argument("--no-build", action="store_true", help="reuse the last loopback build")
    args = ap.parse_args(argv)
    lb = make(args.target, build=not args.no_build)
    ops = [apir_ops.by_name()[o] for o in args.op] if args.op else list(apir_ops.LLAMA_OPS)
    results = run_ops(lb, TARGETS[args.target][2], ops)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.md:
        args.md.write_text(markdown(args.target, results))
    return 0 if all(r["ok"] for r in results.values()) else 1  # type: ignore[index]


if __name__ == "__main__":
    raise SystemExit(main())
