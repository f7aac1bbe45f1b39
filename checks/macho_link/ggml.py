"""libggml-virtgpu-backend and libggml-base, the darwin C++ libraries of the APIR bundle that need no
Apple framework, cross-built for aarch64-macos with zig from the pinned llama.cpp (the verified
PyPI sdist's vendored tree) with the Nix recipe's cmake flags and host patches applied as in Nix. Metal
is off here (it needs Apple's frameworks): only a Mac builds libggml-metal."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from . import macho, toolchain, trees

# The host-side patches, as nix/pkgs/ggml-virtgpu-backend.nix applies them.
PATCHES = ("patches/llama.cpp/0003-ggml-virtgpu-backend-free-buffers-through-ggml.patch",
           "patches/llama.cpp/0005-ggml-virtgpu-backend-reuse-the-decoded-graph.patch",
           "patches/llama.cpp/0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch",
           "patches/llama.cpp/0008-ggml-virtgpu-backend-graph-run.patch",
           "patches/llama.cpp/0009-ggml-virtgpu-backend-zero-new-buffers.patch",
           "patches/llama.cpp/0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
           "patches/llama.cpp/0013-ggml-virtgpu-backend-outputs-with-the-graph.patch",
           "patches/llama.cpp/0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch",
           "patches/llama.cpp/0017-ggml-virtgpu-backend-use-counts.patch",
           "patches/llama.cpp/0018-ggml-virtgpu-backend-refuse-hostile-tensors-and-graphs.patch",
           "patches/llama.cpp/0019-ggml-virtgpu-backend-free-decoded-tensors.patch",
           "patches/llama.cpp/0020-ggml-virtgpu-backend-serve-several-contexts.patch",
           "patches/llama.cpp/0021-ggml-virtgpu-backend-count-decoded-graphs.patch",
           "patches/llama.cpp/0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
           "patches/llama.cpp/0024-ggml-virtgpu-backend-writes-by-reference.patch")
OFFLINE = "patches/cmake/ggml-virtgpu-offline.cmake"
TARGETS = ("ggml-base", "ggml-virtgpu-backend")
# nix/lib/ggml.nix cmakeFlags "metal", Metal off (tests/macho compares them with `nix eval`).
CMAKE_FLAGS = (
    "-DGGML_VIRTGPU:BOOL=TRUE",
    "-DGGML_VIRTGPU_BACKEND=ONLY",
    "-DGGML_CUDA:BOOL=FALSE",
    "-DGGML_METAL:BOOL=FALSE",
    "-DGGML_VULKAN:BOOL=FALSE",
    "-DBUILD_SHARED_LIBS:BOOL=TRUE",
    "-DGGML_NATIVE:BOOL=FALSE",
    "-DLLAMA_BUILD_TESTS:BOOL=FALSE",
    "-DLLAMA_BUILD_EXAMPLES:BOOL=FALSE",
    "-DLLAMA_BUILD_TOOLS:BOOL=FALSE",
    "-DLLAMA_BUILD_SERVER:BOOL=FALSE",
    "-DLLAMA_OPENSSL:BOOL=FALSE",
    "-DGGML_BLAS:BOOL=FALSE",
    "-DLLAMA_BUILD_COMMON:BOOL=FALSE",
    "-DLLAMA_BUILD_APP:BOOL=FALSE",
)
FN_NAME = re.compile(r'#define\s+APIR_\w+_FN_NAME\s+"(\w+)"')


def toolchain_file(root: Path, tools: dict[str, Path]) -> Path:
    text = f"""set(CMAKE_SYSTEM_NAME Darwin)
set(CMAKE_SYSTEM_PROCESSOR arm64)
set(CMAKE_C_COMPILER "{tools["cc"]}")
set(CMAKE_CXX_COMPILER "{tools["c++"]}")
set(CMAKE_AR "{tools["ar"]}")
set(CMAKE_RANLIB "{tools["ranlib"]}")
set(CMAKE_C_FLAGS_INIT "-target {toolchain.TARGET}")
set(CMAKE_CXX_FLAGS_INIT "-target {toolchain.TARGET}")
set(CMAKE_ASM_FLAGS_INIT "-target {toolchain.TARGET}")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-Wl,-undefined,error")
# nothing is installed, so install names need no rewriting
set(CMAKE_INSTALL_NAME_TOOL /bin/true)
"""
    path = root / "zig-aarch64-macos.cmake"
    path.write_text(text)
    return path


def plugin_symbols(upstream: Path, work: Path) -> list[str]:
    """What virglrenderer's APIR loader dlsyms from the backend (src/apir/apir-lib-impl.h)."""
    pin = trees.pin_of("virglrenderer-apir-macos")
    tree = trees.unpack(upstream / pin["upstream_tarball"], work / "virgl", pin["hash"])
    names = FN_NAME.findall((tree / "src/apir/apir-lib-impl.h").read_text())
    if len(names) != 3:
        raise trees.TreeError(f"apir-lib-impl.h: expected 3 APIR_*_FN_NAME, found {names}")
    return sorted(names)


def check(upstream: Path, work: Path, log: Path) -> dict[str, Any]:
    from provision.images.sources import llama_cpp_tree  # the verified sdist's tree (pins.json)

    result: dict[str, Any] = {"tree": "llama-cpp", "cmake_flags": list(CMAKE_FLAGS), "problems": []}
    src = work / "llama.cpp"
    shutil.copytree(llama_cpp_tree(), src, symlinks=True)
    result["patches"] = trees.apply_patches(src, list(PATCHES), log)
    tools = toolchain.wrappers(work / "bin")
    build = work / "build"
    rc = toolchain.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        f"-DCMAKE_TOOLCHAIN_FILE={toolchain_file(work, tools)}",
                        f"-DCMAKE_PROJECT_INCLUDE={trees.REPO / OFFLINE}", *CMAKE_FLAGS], log=log)  # fmt: skip
    if rc != 0:
        result["problems"].append(f"cmake configure failed (rc {rc})")
        return result
    rc = toolchain.run(["ninja", "-C", str(build), *TARGETS], log=log)
    result["build_rc"] = rc
    if rc != 0:
        result["problems"].append(f"ninja {' '.join(TARGETS)} failed (rc {rc})")
    wanted = plugin_symbols(upstream, work)
    for target in TARGETS:
        dylib = build / "bin" / f"lib{target}.dylib"
        try:
            image = macho.parse(dylib.read_bytes() if dylib.exists() else b"")
        except macho.MachOError as exc:
            result["problems"].append(f"lib{target}.dylib: {exc}")
            continue
        if not image.is_arm64_dylib:
            result["problems"].append(f"lib{target}.dylib: not an arm64 dylib")
        if target == "ggml-virtgpu-backend":
            missing = sorted(set(wanted) - image.exported)
            result["plugin_symbols"] = wanted
            result["missing_plugin_symbols"] = missing
            if missing:
                result["problems"].append(f"lib{target}.dylib lacks {missing}, which virglrenderer's APIR dlsyms")
    return result


def cached_check(upstream: Path, cache: Path, fresh: bool = False) -> dict[str, Any]:
    sdist = trees.pin_of("llama-cpp-python-sdist")
    h = hashlib.sha256(json.dumps({"v": trees.CHECK_VERSION, "sdist": sdist, "flags": CMAKE_FLAGS}).encode())
    for rel in (*PATCHES, OFFLINE):
        h.update((trees.REPO / rel).read_bytes())
    h.update(toolchain.inputs_key().encode())
    key = h.hexdigest()[:20]
    return trees.cached_result(cache, f"ggml-{key}", fresh, lambda work, log: check(upstream, work, log))
