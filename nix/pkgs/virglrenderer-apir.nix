# virglrenderer with API Remoting (APIR) and Venus: the MR 1590 head (1.2.0 + the APIR commits) on
# both systems. Linux adds upstream's C23/glibc 2.43 fixes; macOS our darwin series
# (patches/virglrenderer/darwin: builds on macOS, libkrun's macOS blob ABI, MoltenVK first), which
# checks/macho-link cross-builds and links as arm64 Mach-O in CI (docs/nix.md). The meson flag list
# follows the tree's options; the pin's `patches` are applied.
{
  lib,
  stdenv,
  fetchurl,
  fetchFromGitHub,
  fetchFromGitLab,
  buildPackages,
  meson,
  ninja,
  pkg-config,
  runCommandCC,
  libepoxy,
  libdrm,
  libgbm,
  moltenvk,
  vulkan-headers,
  vulkan-loader,
  krunLib,
  pin,
  pinName,
}:
let
  isDarwin = stdenv.hostPlatform.isDarwin;
  sharedLibrary = stdenv.hostPlatform.extensions.sharedLibrary;
  libMoltenVK = "${moltenvk}/lib/libMoltenVK.dylib";
  dlopenRule = krunLib.virglrenderer.moltenvkDlopenRule libMoltenVK;
in
stdenv.mkDerivation (finalAttrs: {
  pname = "virglrenderer-apir";
  version = "${pin.meson_version}-apir-${builtins.substring 0 8 pin.rev}";

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } pinName pin;

  # Linux: upstream's C23/glibc 2.43 build fixes the MR head lacks. macOS: the darwin series.
  patches = map (p: ../.. + "/${p}") (pin.patches or [ ]);

  # macOS: Vulkan is dlopened (vulkan-dload); patch 0003 tries "libMoltenVK.dylib" first, which this
  # makes the store MoltenVK, so a Vulkan loader elsewhere on dyld's path cannot win.
  postPatch = lib.optionalString isDarwin ''
    substituteInPlace ${dlopenRule.file} --replace-fail ${lib.escapeShellArg dlopenRule.from} ${lib.escapeShellArg dlopenRule.to}
  '';

  nativeBuildInputs = [
    meson
    ninja
    pkg-config
    (buildPackages.python3.withPackages (ps: [ ps.pyyaml ]))
  ];

  # MoltenVK is not linked on macOS (dlopened by store path, above), so it is no build input there.
  buildInputs = [
    libepoxy
    vulkan-headers
  ]
  ++ lib.optionals stdenv.hostPlatform.isLinux [
    libdrm
    libgbm
    vulkan-loader
  ];

  # On macOS keep the 1.3 tree's dlopen of the Vulkan library: with vulkan-dload off it asks meson
  # for dependency('vulkan'), which nixpkgs' moltenvk does not provide (no vulkan.pc, no libvulkan).
  mesonFlags = krunLib.virglrenderer.mesonFlags (
    {
      version = pin.meson_version;
      venus = true;
      apir = true;
      drm = false;
      renderServer = false;
    }
    // lib.optionalAttrs isDarwin { vulkanDload = true; }
  );

  # nixpkgs' meson hook defaults, stated here because checks/macho-link cross-builds with exactly
  # these (tests/nix compares): plain (with the tree's b_ndebug=if-release meson still defines
  # NDEBUG, as for release); every auto feature on; no downloads.
  mesonBuildType = "plain";
  mesonAutoFeatures = "enabled";
  mesonWrapMode = "nodownload";

  separateDebugInfo = true;

  passthru = {
    inherit pinName;
    apirProtocol = pin.apir_protocol;
    moltenvkLibrary = if isDarwin then libMoltenVK else null;
    # Only a library built with -Dapir=true contains src/apir, whose context reads this variable
    # (both trees' headers define VIRGL_RENDERER_APIR unconditionally, so the header proves nothing).
    tests.apirEnabled = runCommandCC "virglrenderer-apir-enabled" { } (
      ''
        lib=${finalAttrs.finalPackage}/lib/libvirglrenderer${sharedLibrary}
        grep -qaF VIRGL_APIR_BACKEND_LIBRARY "$lib"
        $NM -g "$lib" | grep -q virgl_renderer_init
      ''
      + lib.optionalString isDarwin ''
        $NM -g "$lib" | grep -q virgl_renderer_resource_get_map_ptr
        grep -q 'VIRGL_RENDERER_BLOB_FD_TYPE_APPLE *0x0004' ${finalAttrs.finalPackage}/include/virgl/virglrenderer.h
        grep -qaF ${lib.escapeShellArg libMoltenVK} "$lib"
        test -e ${lib.escapeShellArg libMoltenVK}
      ''
      + ''
        touch $out
      ''
    );
  };

  meta = {
    description = "virglrenderer with API Remoting (APIR) and Venus";
    homepage = "https://gitlab.freedesktop.org/virgl/virglrenderer/-/merge_requests/1590";
    license = lib.licenses.mit;
    platforms = lib.platforms.darwin ++ lib.platforms.linux;
  };
})
