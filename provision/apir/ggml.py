"""Build plans for ggml from the pinned llama.cpp tree: pure data, no I/O.

A plan says which cmake arguments and which named targets a variant needs; the cmake
adapter runs it. Only named targets are built, never ALL, and every configure gets the
offline venus_hw.h include, so no build reaches the network.

Variants:
  host    libggml-virtgpu-backend + libggml-cpu (GGML_VIRTGPU_BACKEND=ONLY): the APIR host side
          that tests and `provision apir check` drive.
  vulkan  host side + libggml-vulkan (needs libvulkan-dev and glslc).
  cuda    host side + libggml-cuda, FlashAttention on (needs nvcc).
  cuda-tools  the cuda variant's libraries built the same way, plus the host's own llama-bench
          and test-backend-ops on CUDA (libllama, the CPU+CUDA registry libggml): the native
          side of a remoting comparison, from the same objects the APIR backend loads.
  guest   the ggml-virtgpu frontend and llama-bench, as the guest image builds them
          (needs libdrm and a drm/virtgpu_drm.h with the execbuffer syncobj fields).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from provision.apir.route import KNOWN_REGS
from provision.core.errors import InvalidValue

# Bump when the plan changes in a way the flags below do not show (a new step, a new artifact).
RECIPE_VERSION = 1

# Flags every variant shares: a release build of shared libraries with no llama.cpp extras,
# portable CPU code (the cache must not depend on the build machine's CPU), and RUNPATH=$ORIGIN
# so the promoted bin/ directory works wherever it lands.
_COMMON = {
    "CMAKE_BUILD_TYPE": "Release",
    "BUILD_SHARED_LIBS": "ON",
    "GGML_NATIVE": "OFF",
    "CMAKE_BUILD_RPATH_USE_ORIGIN": "ON",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_BUILD_APP": "OFF",
    "LLAMA_OPENSSL": "OFF",
}

_HOST = {**_COMMON, "GGML_VIRTGPU": "ON", "GGML_VIRTGPU_BACKEND": "ONLY", "LLAMA_BUILD_COMMON": "OFF",
         "LLAMA_BUILD_TOOLS": "OFF"}
_HOST_TARGETS = ("ggml-virtgpu-backend", "ggml-cpu")
_HOST_LIBS = ("libggml-base.so", "libggml-cpu.so", "libggml-virtgpu-backend.so")
# Our host-side fixes to the APIR backend (patches/llama.cpp/), applied to a copy of the tree by every
# build of it: ggml builds here, the route's chroot build, the loopback, Nix. 0003: buffers are freed
# through ggml (the exit double free); 0005: the decoded graph is reused while the guest sends the
# same bytes, and the previous one freed (it leaked a ggml context per token); 0006 + 0008: APIR 0.3,
# GRAPH_RUN (a token's writes and its graph, or the graph's uid, in one round trip; 0006 is shared
# with the guest series, which must be 0.3 too); 0009: buffers zeroed when allocated (ggml-cuda's
# padding of quantized rows, which its init_tensor would zero, is never initialized otherwise);
# 0011 + 0013: APIR 0.4, the outputs a guest reads after a graph copied into its pages with the run;
# 0015 + 0017: APIR 0.5, the decoded graph gets the guest's use counts, so the backend fuses ops;
# 0018: what a hostile guest sends is refused; 0019: a tensor command's tensors freed when it returns;
# 0020: several virgl contexts in one process (krunkit's) share the backend, each freeing its own buffers;
# 0021: the graphs decoded are counted, for checks that a graph run by its uid is not decoded again;
# 0022 + 0024: APIR 0.6, a write's bytes taken from the guest's shared pages it names (no guest copy).
HOST_PATCHES = ("0003-ggml-virtgpu-backend-free-buffers-through-ggml.patch",
                "0005-ggml-virtgpu-backend-reuse-the-decoded-graph.patch",
                "0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch",
                "0008-ggml-virtgpu-backend-graph-run.patch",
                "0009-ggml-virtgpu-backend-zero-new-buffers.patch",
                "0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
                "0013-ggml-virtgpu-backend-outputs-with-the-graph.patch",
                "0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch",
                "0017-ggml-virtgpu-backend-use-counts.patch",
                "0018-ggml-virtgpu-backend-refuse-hostile-tensors-and-graphs.patch",
                "0019-ggml-virtgpu-backend-free-decoded-tensors.patch",
                "0020-ggml-virtgpu-backend-serve-several-contexts.patch",
                "0021-ggml-virtgpu-backend-count-decoded-graphs.patch",
                "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
                "0024-ggml-virtgpu-backend-writes-by-reference.patch")


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    defines: dict[str, str]
    targets: tuple[str, ...]
    artifacts: tuple[str, ...]          # files expected in bin/ after the build
    tools: tuple[str, ...]              # programs the build needs on PATH
    ggml_library: str | None = None     # the ggml backend library APIR should load
    ggml_reg: str | None = None         # its registration symbol
    needs_drm_headers: bool = False
    in_ci: bool = False
    patches: tuple[str, ...] = ()       # of patches/llama.cpp/, applied in order to a copy of the tree


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("host", "APIR host backend + CPU backend", _HOST, _HOST_TARGETS, _HOST_LIBS,
                ("cmake", "ninja", "c++"), "libggml-cpu.so", KNOWN_REGS["cpu"], in_ci=True, patches=HOST_PATCHES),
        Variant("vulkan", "APIR host backend + Vulkan backend", {**_HOST, "GGML_VULKAN": "ON"},
                (*_HOST_TARGETS, "ggml-vulkan"), (*_HOST_LIBS, "libggml-vulkan.so"),
                ("cmake", "ninja", "c++", "glslc"), "libggml-vulkan.so", KNOWN_REGS["vulkan"], patches=HOST_PATCHES),
        Variant("cuda", "APIR host backend + CUDA backend (FlashAttention on)",
                {**_HOST, "GGML_CUDA": "ON", "GGML_CUDA_FA": "ON"},
                (*_HOST_TARGETS, "ggml-cuda"), (*_HOST_LIBS, "libggml-cuda.so"),
                ("cmake", "ninja", "c++", "nvcc"), "libggml-cuda.so", KNOWN_REGS["cuda"], patches=HOST_PATCHES),
        Variant("cuda-tools", "cuda variant + native llama-bench and test-backend-ops on CUDA",
                {**_HOST, "GGML_CUDA": "ON", "GGML_CUDA_FA": "ON", "LLAMA_BUILD_COMMON": "ON",
                 "LLAMA_BUILD_TOOLS": "ON", "LLAMA_BUILD_TESTS": "ON"},
                (*_HOST_TARGETS, "ggml-cuda", "ggml", "llama-bench", "test-backend-ops"),
                (*_HOST_LIBS, "libggml-cuda.so", "libggml.so", "libllama.so", "llama-bench", "test-backend-ops"),
                ("cmake", "ninja", "c++", "nvcc"), "libggml-cuda.so", KNOWN_REGS["cuda"], patches=HOST_PATCHES),
        Variant("guest", "guest ggml-virtgpu frontend + llama-bench",
                {**_COMMON, "GGML_VIRTGPU": "ON", "GGML_VULKAN": "OFF", "LLAMA_BUILD_COMMON": "ON",
                 "LLAMA_BUILD_TOOLS": "ON"},
                ("ggml-virtgpu", "llama-bench"), ("libggml-virtgpu.so", "llama-bench"),
                ("cmake", "ninja", "c++", "pkg-config"), needs_drm_headers=True, in_ci=True),
    )
}


def variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise InvalidValue(f"ggml build variant {name!r} is unknown (known: {', '.join(VARIANTS)})") from None


@dataclass(frozen=True)
class BuildPlan:
    variant: str
    key: str
    source: Path
    build_dir: Path
    configure: list[str]
    build: list[str]
    artifacts: tuple[str, ...]
    inputs: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["source"] = str(self.source)
        data["build_dir"] = str(self.build_dir)
        return data


def cache_key(v: Variant, *, source_sha256: str, cuda_architectures: str | None = None,
              drm_headers_sha256: str | None = None) -> str:
    """Key of a promoted build: everything that changes its bytes, hashed."""
    inputs = {
        "recipe": RECIPE_VERSION,
        "source_sha256": source_sha256,
        "variant": asdict(v),
        "cuda_architectures": cuda_architectures,
        "drm_headers_sha256": drm_headers_sha256,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]
    return f"{v.name}-{digest}"


def plan(v: Variant, *, source: Path, build_dir: Path, key: str, offline_include: Path, jobs: int = 2,
         cuda_architectures: str | None = None, drm_include_dir: Path | None = None,
         cmake: str = "cmake", ninja: str = "ninja") -> BuildPlan:
    defines = dict(v.defines)
    defines["CMAKE_PROJECT_INCLUDE"] = str(offline_include)
    if "GGML_CUDA" in defines:
        if not cuda_architectures:
            raise InvalidValue("the cuda variant needs CUDA architectures (e.g. --cuda-arch 90 for H100/H200)")
        defines["CMAKE_CUDA_ARCHITECTURES"] = cuda_architectures
    if v.needs_drm_headers:
        if drm_include_dir is None:
            raise InvalidValue(f"the {v.name} variant needs a drm/virtgpu_drm.h include directory")
        # CMAKE_CXX_FLAGS -I comes after ggml-virtgpu's own -I/usr/include/libdrm, whose
        # virtgpu_drm.h sits at a path that <drm/virtgpu_drm.h> never matches.
        defines["CMAKE_C_FLAGS"] = f"-I{drm_include_dir}"
        defines["CMAKE_CXX_FLAGS"] = f"-I{drm_include_dir}"
    configure = [cmake, "-S", str(source), "-B", str(build_dir), "-G", "Ninja",
                 *(f"-D{k}={val}" for k, val in sorted(defines.items()))]
    build = [ninja, "-C", str(build_dir), f"-j{jobs}", *v.targets]
    return BuildPlan(v.name, key, source, build_dir, configure, build, v.artifacts,
                     {"cuda_architectures": cuda_architectures,
                      "drm_include_dir": str(drm_include_dir) if drm_include_dir else None})
