"""The APIR route without a VM: test-backend-ops against "[virtgpu] <host device>" in one process.

checks/apir-loopback/virtgpu-loopback.cpp stands in for the frontend's DRM transport and for
virglrenderer's APIR component, so the guest frontend (with our patches) and the host
backend library (libggml-virtgpu-backend + ggml-vulkan, from `provision host-tools --apir`)
exchange exactly the bytes they exchange through QEMU. Built and run in the host-tools chroot,
where the host ggml lives; on the host (``on_host``, CPU target) it needs neither the chroot nor
the virglrenderer tree and builds against the `host` ggml variant, which is how CI covers the op
list. `checks/apir-loopback/run-ops` runs the op list either way and prints or writes the results.

A host-side abort ends the test process here (in a VM it ends the render worker): the
output then stops in the middle of an op's cases, which `apir.ops.parse` reports as not
finished, and the process's exit status says how it died.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters import runner
from provision.adapters.chroot import Chroot
from provision.apir import ggml as ggml_build
from provision.apir import ops as apir_ops
from provision.apir import route as apir_route
from provision.core import catalog, layout, paths
from provision.core.errors import HostToolsMissing, InvalidValue
from provision.core.log import say
from provision.hosts.linux.apir import host_side
from provision.hosts.linux.tools import host_tools
from provision.images import sources

SRC_LLAMA = "/src/llama.cpp"
SRC_LOOPBACK = "/src/loopback"
SRC_PATCHES = "/src/patches"
WORK = "/work"
BACKEND_SOURCES = (
    "backend.cpp", "backend-dispatched.cpp", "backend-dispatched-backend.cpp", "backend-dispatched-device.cpp",
    "backend-dispatched-buffer.cpp", "backend-dispatched-buffer-type.cpp", "apir_cs_ggml-rpc-back.cpp",
)
# Host-side fixes: applied to the backend library the loopback builds, as to every host build
# (the guest image does not build the backend, so they are not in its stack).
HOST_PATCHES = ggml_build.HOST_PATCHES
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


@dataclass(frozen=True)
class Where:
    """Where the build finds its inputs and puts its outputs, as its shell sees them.

    In the host-tools chroot these are bind targets; on the host (the CI path, CPU target
    only) they are real directories, and ``drm_include`` names the pinned drm/ headers that
    Debian 12 lacks."""

    llama: str = SRC_LLAMA
    loopback: str = SRC_LOOPBACK
    patches: str = SRC_PATCHES
    work: str = WORK
    lib: str = str(host_side.GGML_PREFIX / "lib")
    drm_include: str | None = None

    @property
    def bin(self) -> str:
        return f"{self.work}/bin"


CHROOT = Where()


def build_script(patches: Sequence[str], target: str = "vulkan", where: Where = CHROOT,
                 host_patches: Sequence[str] = HOST_PATCHES, transport: str | None = None,
                 transport_flags: Sequence[str] = ()) -> str:
    """Shell: patch a copy of the frontend, build it with the loopback, and build
    test-backend-ops against the host ggml (it needs ggml only, not libllama). The backend
    registry (libggml.so) is built here with just the CPU backend and the target, so the CPU
    target needs no Vulkan build. ``transport`` replaces the loopback's own file (a path as the
    shell sees it; checks/libkrun-replay routes the frontend through virglrenderer), with the
    compiler and linker flags it needs."""
    q = shlex.quote
    transport = q(transport) if transport else f"{q(where.loopback)}/virtgpu-loopback.cpp"
    extra = "".join(f" {q(f)}" for f in transport_flags)
    w, b, lib = q(where.work), q(where.bin), q(where.lib)
    front = f"{w}/src/ggml/src/ggml-virtgpu"
    inc = f"-I{w}/src/ggml/include -I{w}/src/ggml/src"
    # A host without libdrm-dev (a GPU machine that is not ours) carries xf86drm.h and libdrm/ there too.
    drm = f"-I{q(where.drm_include)} -I{q(where.drm_include + '/libdrm')} " if where.drm_include else ""
    uses = "-DGGML_USE_CPU" + (" -DGGML_USE_VULKAN" if target == "vulkan" else "")
    links = "-lggml-cpu" + (" -lggml-vulkan" if target == "vulkan" else "")
    rpath = f"-Wl,-rpath,{b}:{lib}"
    loop = q(where.loopback)
    lines = [
        "set -eu",
        f"rm -rf {w}/src {b}/libggml-virtgpu.so && mkdir -p {w}/src {b} {w}/venus",
        f": > {w}/venus/venus_hw.h",
        f"cp -r {q(where.llama)}/ggml {w}/src/ && mkdir -p {w}/src/tests",
        f"cp {q(where.llama)}/tests/test-backend-ops.cpp {w}/src/tests/",
        *(f"patch -d {w}/src -p1 --forward --batch -i {q(where.patches + '/' + p)}"
          for p in dict.fromkeys([*patches, *host_patches])),  # 0006 is in both series: once
        # The host library, from the same patched tree (the host-tools one is unpatched).
        f"g++ -std=c++20 -O1 -g -fPIC -shared -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED {inc} -I{front}/.. "
        + " ".join(f"{front}/backend/{s}" for s in BACKEND_SOURCES)
        + f" -o {b}/libggml-virtgpu-backend.so -L{lib} -lggml-base {rpath}",
        # The backend registry loads libggml-virtgpu.so from the executable's directory and
        # calls its ggml_backend_init (GGML_BACKEND_DL).
        f"g++ -std=c++20 -O1 -g -fPIC -shared -DGGML_BACKEND_DL -DGGML_BACKEND_BUILD -DGGML_BACKEND_SHARED {inc} "
        f"{drm}-I{front} -I{front}/include -I{w}/venus -I/usr/include/libdrm "
        + " ".join(f"{front}/{s}" for s in FRONTEND_SOURCES)
        + f" {transport} -o {b}/libggml-virtgpu.so -L{lib} -lggml-base -Wl,-rpath,{lib}{extra}",
        f"g++ -std=c++17 -O1 -g {inc} {loop}/repro-supports-op-gap.cpp -o {b}/repro-supports-op-gap "
        f"-L{lib} -lggml-base -Wl,-rpath,{lib}",
        f"g++ -std=c++17 -O1 -fPIC -shared {uses} -DGGML_BUILD -DGGML_SHARED {inc} "
        f"{w}/src/ggml/src/ggml-backend-reg.cpp {w}/src/ggml/src/ggml-backend-dl.cpp "
        f"-o {b}/libggml.so -L{lib} -lggml-base {links} {rpath}",
        # A llama-like decode loop checked value by value (APIR 0.3: inputs with the graph, the graph by uid;
        # 0.4: the output with it).
        f"g++ -std=c++17 -O1 {inc} {loop}/graph-run-check.cpp -o {b}/graph-run-check -L{b} -L{lib} -lggml "
        f"-lggml-base {rpath}",
        # GRAPH_RUN commands the host must refuse, written by hand (an older guest; forged read records):
        # guest and host built from one tree share one protocol header, so the loopback cannot send them.
        f"g++ -std=c++17 -O1 -g {inc} -I{front} {loop}/graph-run-refusals.cpp -o {b}/graph-run-refusals -ldl",
        # The guest reserves what the host's buffer type asks for (0010; APIR_LOOPBACK_ALLOC_PAD pads its answers).
        f"g++ -std=c++17 -O1 {inc} {loop}/alloc-size-check.cpp -o {b}/alloc-size-check -L{b} -L{lib} -lggml "
        f"-lggml-base {rpath}",
        # Reads of one run that do not fit the command's pages together (0014: GET_TENSOR after the run).
        f"g++ -std=c++17 -O1 {inc} {loop}/wide-reads-check.cpp -o {b}/wide-reads-check -L{b} -L{lib} -lggml "
        f"-lggml-base {rpath}",
        # The test program is one large file that does not change with our patches: compile once.
        f"test -f {w}/test-backend-ops.o || g++ -std=c++17 -O1 -c {inc} {w}/src/tests/test-backend-ops.cpp "
        f"-o {w}/test-backend-ops.o",
        f"g++ {w}/test-backend-ops.o -o {b}/test-backend-ops -L{b} -L{lib} -lggml -lggml-base -lpthread {rpath}",
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


def run_env(target: str, where: Where = CHROOT) -> dict[str, str]:
    """The hypervisor's environment for the backend library, as on the VM route."""
    library, reg, _device = TARGETS[target]
    return {
        "VIRGL_APIR_BACKEND_LIBRARY": f"{where.bin}/libggml-virtgpu-backend.so",
        "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": f"{where.lib}/{library}",
        "APIR_LLAMA_CPP_GGML_LIBRARY_REG": reg,
        # lavapipe is a CPU-type Vulkan device, which ggml-vulkan hides unless listed.
        "GGML_VK_VISIBLE_DEVICES": "0",
        "VK_DRIVER_FILES": "/usr/share/vulkan/icd.d/lvp_icd.json",
    }


@dataclass(frozen=True)
class Loopback:
    where: Where
    env: dict[str, str]
    host_work: Path  # where.work as this process sees it
    chroot: Chroot | None = None  # None: built and run on the host

    def argv(self, program: Sequence[str]) -> list[str]:
        if self.chroot is not None:
            return self.chroot.argv(program, self.env)
        clean = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "LANG": "C.UTF-8", **self.env}
        return ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in clean.items()), *program]

    def test_backend_ops(self, args: Sequence[str], timeout_s: float = 900) -> tuple[int, str]:
        lines: list[str] = []  # all of it, also what came before a timeout: the report parses every case
        done = runner.run(self.argv([f"{self.where.bin}/test-backend-ops", *args]), name="apir-loopback",
                          timeout=timeout_s, on_line=lines.append)  # fmt: skip
        return done.status, "".join(line + "\n" for line in lines)

    def build(self, target: str) -> None:
        script = build_script(guest_patches(), target, self.where)
        done = runner.run(self.argv(["sh", "-c", script]), name="apir-loopback-build", stderr=runner.STDOUT)
        if done.status != 0:
            raise HostToolsMissing(
                "building the APIR loopback failed: " + done.out[-1500:],
                fix="see the compiler output above; the host ggml and the pinned tree must be the same version",
            )


def _in_chroot(target: str) -> Loopback:
    tools = host_tools.locate()
    lib = host_side.GGML_PREFIX / "lib"
    needed = [lib / "libggml-base.so", lib / TARGETS[target][0]]
    if tools is None or not tools.is_chroot or not all((tools.root / str(p).lstrip("/")).exists() for p in needed):
        raise HostToolsMissing(
            f"the APIR loopback needs the host ggml ({', '.join(p.name for p in needed)}) in the host-tools chroot",
            fix="run `provision host-tools --apir` (with --virgl-src DIR where the pinned tree cannot be fetched)",
        )
    binds = {
        sources.llama_cpp_tree(): SRC_LLAMA,
        loopback_dir(): SRC_LOOPBACK,
        layout.patches_dir() / "llama.cpp": SRC_PATCHES,
        paths.cache_dir("apir-loopback"): WORK,
    }
    return Loopback(CHROOT, run_env(target, CHROOT), paths.cache_dir("apir-loopback"), Chroot(tools.root, binds))


def _on_host(target: str) -> Loopback:
    """No chroot and no virglrenderer tree: the `host` ggml build (CI's) and the pinned drm/
    headers, both from the sdist's pins. CPU target only (Debian 12 cannot build ggml-vulkan)."""
    if target != "cpu":
        raise InvalidValue(f"--target {target} with --on-host: the host ggml build has only the CPU backend",
                           fix="use --target cpu with --on-host, or drop --on-host to use the host-tools chroot")
    from provision.apir import builds  # the cached `host` variant; builds it on first use

    work = paths.cache_dir("apir-loopback-host")
    where = Where(
        llama=str(sources.llama_cpp_tree()),
        loopback=str(loopback_dir()),
        patches=str(layout.patches_dir() / "llama.cpp"),
        work=str(work),
        lib=str(builds.ensure("host").bin_dir),
        drm_include=str(builds.drm_headers()),
    )
    return Loopback(where, run_env(target, where), work)


def make(target: str = "vulkan", log: Callable[[str], None] | None = None, *, build: bool = True,
         on_host: bool = False) -> Loopback:
    log = log or say("apir")  # stderr: stdout is for --json
    lb = _on_host(target) if on_host else _in_chroot(target)
    if build or not (lb.host_work / "bin" / "test-backend-ops").exists():
        log(f"apir loopback: building ({'host' if on_host else 'host-tools chroot'}, target {target})")
        lb.build(target)
    return lb


def run_ops(lb: Loopback, device: str, ops: Sequence[apir_ops.Op] = apir_ops.LLAMA_OPS) -> dict[str, object]:
    """Each op in its own process: a host abort ends that op's run only, and shows in its exit."""
    results: dict[str, object] = {}
    for op in ops:
        rc, out = lb.test_backend_ops(apir_ops.tbo_argv(op, device)[1:])
        res = apir_ops.parse(out, op.name, device)
        results[op.name] = {"exit": rc, **res.summary(), "ok": res.ok and rc == 0}
    return results


def markdown(target: str, results: dict[str, object], on_host: bool = False) -> str:
    device = TARGETS[target][2]
    lines = [
        f"# APIR loopback: the llama op list on {device}, without a VM",
        "",
        "Guest frontend (pinned llama.cpp + patches/llama.cpp/*) and host libggml-virtgpu-backend in one process, "
        "joined by checks/apir-loopback/virtgpu-loopback.cpp (no QEMU, no virglrenderer); host ggml target: "
        f"{TARGETS[target][0]}. Command: `checks/apir-loopback/run-ops --target {target}"
        f"{' --on-host' if on_host else ''}`.",
        "",
        f"| op | cases run on {device} | passed | refused (run elsewhere) | exit | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in results.items():
        assert isinstance(r, dict)
        lines.append(f"| {name} | {r['ran']} | {r['passed']} | {r['unsupported']} | {r['exit']} | "
                     f"{'yes' if r['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"

