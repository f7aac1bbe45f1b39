# The host half of API Remoting: libggml-virtgpu-backend (loaded by virglrenderer's APIR
# context) plus the real ggml backend it forwards to (Metal on macOS, Vulkan or CUDA on Linux)
# and libggml-base. Built from the same llama.cpp pin as the guest images so the guest frontend
# and this backend speak the same APIR protocol.
{
  lib,
  stdenv,
  config,
  fetchurl,
  fetchFromGitHub,
  fetchFromGitLab,
  autoAddDriverRunpath,
  cmake,
  fixDarwinDylibNames,
  ninja,
  pkg-config,
  runCommandCC,
  shaderc,
  spirv-headers,
  vulkan-headers,
  vulkan-loader,
  cudaPackages ? { },
  krunLib,
  pin,
  cudaSupport ? config.cudaSupport,
  metalSupport ? stdenv.hostPlatform.isDarwin && !cudaSupport,
  vulkanSupport ? stdenv.hostPlatform.isLinux && !cudaSupport,
}:
let
  ggml = krunLib.ggml;
  backend = ggml.pickBackend { inherit metalSupport vulkanSupport cudaSupport; };
  effectiveStdenv = if cudaSupport then cudaPackages.backendStdenv else stdenv;
  sharedLibrary = stdenv.hostPlatform.extensions.sharedLibrary;
in
effectiveStdenv.mkDerivation (finalAttrs: {
  pname = "ggml-virtgpu-backend-${backend}";
  version = "0-unstable-${builtins.substring 0 8 pin.rev}";

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } "llama-cpp" pin;

  # The host-side fixes the Linux route applies (provision/hosts/linux/apir/loopback.py HOST_PATCHES):
  # buffers are freed through ggml, so a backend buffer without free_buffer neither leaks nor kills
  # the worker; an unchanged graph is not decoded again each token, and a decoded one is freed;
  # APIR 0.3 (0006 shared with the guest series, 0008): a token's writes and graph in one round trip;
  # APIR 0.4 (0011 shared, 0013): the outputs the guest reads come back with the graph run;
  # APIR 0.5 (0015 shared, 0017): the decoded graph gets the guest's use counts (ops fused as natively).
  # 0018: tensors and graphs a hostile guest sends are refused, not trusted (no protocol change);
  # 0019: the tensors of SET/GET/CPY_TENSOR freed when the command returns (each left a context behind);
  # 0020: krunkit's guest processes (virgl contexts in its one process) share the backend, not one at a time;
  # 0021: the graphs decoded are counted (for checks; no protocol change);
  # APIR 0.6 (0022 shared, 0024): a write's bytes taken from the guest's shared pages it names.
  patches = [
    ../../patches/llama.cpp/0003-ggml-virtgpu-backend-free-buffers-through-ggml.patch
    ../../patches/llama.cpp/0005-ggml-virtgpu-backend-reuse-the-decoded-graph.patch
    ../../patches/llama.cpp/0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch
    ../../patches/llama.cpp/0008-ggml-virtgpu-backend-graph-run.patch
    ../../patches/llama.cpp/0009-ggml-virtgpu-backend-zero-new-buffers.patch
    ../../patches/llama.cpp/0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch
    ../../patches/llama.cpp/0013-ggml-virtgpu-backend-outputs-with-the-graph.patch
    ../../patches/llama.cpp/0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch
    ../../patches/llama.cpp/0017-ggml-virtgpu-backend-use-counts.patch
    ../../patches/llama.cpp/0018-ggml-virtgpu-backend-refuse-hostile-tensors-and-graphs.patch
    ../../patches/llama.cpp/0019-ggml-virtgpu-backend-free-decoded-tensors.patch
    ../../patches/llama.cpp/0020-ggml-virtgpu-backend-serve-several-contexts.patch
    ../../patches/llama.cpp/0021-ggml-virtgpu-backend-count-decoded-graphs.patch
    ../../patches/llama.cpp/0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch
    ../../patches/llama.cpp/0024-ggml-virtgpu-backend-writes-by-reference.patch
  ];

  nativeBuildInputs = [
    cmake
    ninja
    pkg-config
  ]
  ++ lib.optionals stdenv.hostPlatform.isDarwin [ fixDarwinDylibNames ]
  ++ lib.optionals cudaSupport [
    cudaPackages.cuda_nvcc
    autoAddDriverRunpath
  ]
  ++ lib.optionals vulkanSupport [
    shaderc
    spirv-headers
  ];

  buildInputs =
    lib.optionals vulkanSupport [
      vulkan-headers
      vulkan-loader
    ]
    ++ lib.optionals cudaSupport [
      cudaPackages.cccl
      cudaPackages.cuda_cudart
      cudaPackages.libcublas
    ];

  cmakeFlags =
    ggml.cmakeFlags backend
    ++ [
      # ggml-virtgpu declares an ExternalProject that downloads venus_hw.h, even in ONLY mode
      # where nothing includes it; this file turns it into an empty target (no network in Nix).
      (lib.cmakeFeature "CMAKE_PROJECT_INCLUDE" "${../../patches/cmake/ggml-virtgpu-offline.cmake}")
      # Libraries are copied out of the build tree, so give them their final RPATH right away.
      (lib.cmakeBool "CMAKE_BUILD_WITH_INSTALL_RPATH" true)
      (lib.cmakeFeature "CMAKE_INSTALL_RPATH" "${placeholder "out"}/lib")
    ]
    ++ lib.optionals cudaSupport [
      (lib.cmakeFeature "CMAKE_CUDA_ARCHITECTURES" cudaPackages.flags.cmakeCudaArchitecturesString)
    ];

  # Only the named targets: `all` would also pull in llama, tools and the download step.
  ninjaFlags = ggml.buildTargets backend;

  installPhase = ''
    runHook preInstall
    mkdir -p $out/lib
    for name in ${lib.escapeShellArgs (ggml.libraries backend)}; do
      found=
      for f in bin/lib$name.*; do
        [ -e "$f" ] || continue
        cp -P "$f" $out/lib/
        found=1
      done
      [ -n "$found" ] || { echo "ggml-virtgpu-backend: lib$name not built" >&2; exit 1; }
      [ -e "$out/lib/lib$name${sharedLibrary}" ] || { echo "missing lib$name${sharedLibrary}" >&2; exit 1; }
    done
    runHook postInstall
  '';

  passthru = {
    inherit backend;
    ggmlBackend = ggml.backend backend;
    # The environment virglrenderer's APIR loader needs to use this build.
    runtimeEnv = ggml.runtimeEnv {
      name = backend;
      package = finalAttrs.finalPackage;
      inherit sharedLibrary;
    };
    tests.entryPoints = runCommandCC "ggml-virtgpu-backend-entry-points" { } ''
      $NM -g ${finalAttrs.finalPackage}/lib/libggml-virtgpu-backend${sharedLibrary} > backend.syms
      for sym in apir_backend_initialize apir_backend_dispatcher; do
        grep -q "$sym" backend.syms || { echo "missing $sym" >&2; exit 1; }
      done
      $NM -g ${finalAttrs.finalPackage}/lib/lib${(ggml.backend backend).target}${sharedLibrary} \
        | grep -q ${(ggml.backend backend).reg}
      touch $out
    '';
  };

  meta = {
    description = "ggml API Remoting host backend (libggml-virtgpu-backend) with the ${backend} ggml backend";
    homepage = "https://github.com/ggml-org/llama.cpp";
    license = lib.licenses.mit;
    platforms = if metalSupport then lib.platforms.darwin else lib.platforms.linux;
  };
})
