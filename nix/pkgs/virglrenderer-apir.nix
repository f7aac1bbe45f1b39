# virglrenderer with API Remoting (APIR) and Venus. Linux builds the MR 1590 head (1.2.0 + the
# APIR commits); macOS builds a 1.3.0-based tree that also carries the macOS APIR adaptation
# commits, which the MR head lacks (docs/nix.md). The meson flag list follows each tree's options.
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
in
stdenv.mkDerivation (finalAttrs: {
  pname = "virglrenderer-apir";
  version = "${pin.meson_version}-apir-${builtins.substring 0 8 pin.rev}";

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } pinName pin;

  nativeBuildInputs = [
    meson
    ninja
    pkg-config
    (buildPackages.python3.withPackages (ps: [ ps.pyyaml ]))
  ];

  buildInputs = [
    libepoxy
    vulkan-headers
  ]
  ++ lib.optionals isDarwin [ moltenvk ]
  ++ lib.optionals stdenv.hostPlatform.isLinux [
    libdrm
    libgbm
    vulkan-loader
  ];

  # On macOS link MoltenVK at build time instead of the 1.3 tree's default dlopen of a loader.
  mesonFlags = krunLib.virglrenderer.mesonFlags (
    {
      version = pin.meson_version;
      venus = true;
      apir = true;
      drm = false;
      renderServer = false;
    }
    // lib.optionalAttrs isDarwin { vulkanDload = false; }
  );

  separateDebugInfo = true;

  passthru = {
    inherit pinName;
    apirProtocol = pin.apir_protocol;
    # The installed header must carry the APIR context flag, and the library its entry points.
    tests.apirEnabled = runCommandCC "virglrenderer-apir-enabled" { } ''
      grep -q VIRGL_RENDERER_APIR ${finalAttrs.finalPackage}/include/virgl/virglrenderer.h
      $NM -g ${finalAttrs.finalPackage}/lib/libvirglrenderer${stdenv.hostPlatform.extensions.sharedLibrary} \
        | grep -q virgl_renderer_init
      touch $out
    '';
  };

  meta = {
    description = "virglrenderer with API Remoting (APIR) and Venus";
    homepage = "https://gitlab.freedesktop.org/virgl/virglrenderer/-/merge_requests/1590";
    license = lib.licenses.mit;
    platforms = lib.platforms.darwin ++ lib.platforms.linux;
  };
})
