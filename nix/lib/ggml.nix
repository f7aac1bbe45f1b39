# The host side of APIR: which ggml backend libggml-virtgpu-backend forwards to, and the flags
# that build only that (no llama tools, no server, no frontend, nothing that needs the network).
{ lib }:
let
  # One entry per real ggml backend the host can offer. `target` is the CMake target (and the
  # library name without "lib"), `reg` the registration symbol virglrenderer's APIR loader
  # resolves through APIR_LLAMA_CPP_GGML_LIBRARY_REG.
  backends = {
    metal = {
      cmake = "GGML_METAL";
      target = "ggml-metal";
      reg = "ggml_backend_metal_reg";
    };
    vulkan = {
      cmake = "GGML_VULKAN";
      target = "ggml-vulkan";
      reg = "ggml_backend_vk_reg";
    };
    cuda = {
      cmake = "GGML_CUDA";
      target = "ggml-cuda";
      reg = "ggml_backend_cuda_reg";
    };
  };

  backend =
    name:
    backends.${name}
      or (throw "krun-gpu: unknown ggml backend '${name}' (known: ${lib.concatStringsSep ", " (lib.attrNames backends)})");

  # Exactly one of the override switches must be on; returns the backend's name.
  pickBackend =
    {
      metalSupport,
      vulkanSupport,
      cudaSupport,
    }:
    let
      on = lib.optional metalSupport "metal" ++ lib.optional vulkanSupport "vulkan" ++ lib.optional cudaSupport "cuda";
    in
    if lib.length on == 1 then
      lib.head on
    else
      throw "krun-gpu: ggml-virtgpu-backend needs exactly one of metalSupport, vulkanSupport, cudaSupport (got: ${
        if on == [ ] then "none" else lib.concatStringsSep ", " on
      })";
in
{
  inherit backends backend pickBackend;

  # The targets to build by name: the APIR backend plus the real backend. Building named targets
  # keeps the venus_hw_header ExternalProject (part of ALL) from running at all.
  buildTargets = name: [
    "ggml-virtgpu-backend"
    (backend name).target
  ];

  # Libraries the package installs (ggml-base is what both of the others link).
  libraries = name: [
    "ggml-base"
    "ggml-virtgpu-backend"
    (backend name).target
  ];

  cmakeFlags =
    name:
    let
      chosen = backend name;
    in
    [
      (lib.cmakeBool "GGML_VIRTGPU" true)
      # ggml compares this option with STREQUAL "ONLY": backend only, no guest frontend (no libdrm).
      "-DGGML_VIRTGPU_BACKEND=ONLY"
    ]
    ++ lib.mapAttrsToList (n: b: lib.cmakeBool b.cmake (b == chosen)) backends
    ++ lib.optional (name == "metal") (lib.cmakeBool "GGML_METAL_EMBED_LIBRARY" true)
    ++ [
      (lib.cmakeBool "BUILD_SHARED_LIBS" true)
      # -march=native would make the result depend on the build machine.
      (lib.cmakeBool "GGML_NATIVE" false)
      (lib.cmakeBool "LLAMA_BUILD_TESTS" false)
      (lib.cmakeBool "LLAMA_BUILD_EXAMPLES" false)
      (lib.cmakeBool "LLAMA_BUILD_TOOLS" false)
      (lib.cmakeBool "LLAMA_BUILD_SERVER" false)
      (lib.cmakeBool "LLAMA_OPENSSL" false)
      # As the Linux recipe (provision/apir/ggml.py): a standalone tree turns these on by default,
      # and on Apple GGML_BLAS defaults ON and fails configure without Accelerate; none is needed.
      (lib.cmakeBool "GGML_BLAS" false)
      (lib.cmakeBool "LLAMA_BUILD_COMMON" false)
      (lib.cmakeBool "LLAMA_BUILD_APP" false)
    ];

  # What virglrenderer's APIR loader reads (src/apir/apir-context.c): the APIR backend library,
  # the real ggml backend library it dlopens, and that library's registration symbol.
  runtimeEnv =
    {
      name,
      package,
      sharedLibrary,
    }:
    {
      VIRGL_APIR_BACKEND_LIBRARY = "${package}/lib/libggml-virtgpu-backend${sharedLibrary}";
      APIR_LLAMA_CPP_GGML_LIBRARY_PATH = "${package}/lib/lib${(backend name).target}${sharedLibrary}";
      APIR_LLAMA_CPP_GGML_LIBRARY_REG = (backend name).reg;
    };
}
