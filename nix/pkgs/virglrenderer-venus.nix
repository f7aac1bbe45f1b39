# virglrenderer from slp's krunkit fork (0.10.4x): Venus on MoltenVK, the renderer krunkit uses
# without APIR. Same recipe as nixpkgs' libkrun-efi keeps privately, as a package of its own here.
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
  moltenvk,
  vulkan-headers,
  krunLib,
  pin,
}:
stdenv.mkDerivation (finalAttrs: {
  pname = "virglrenderer-venus";
  inherit (pin) version;

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } "virglrenderer-venus" pin;

  nativeBuildInputs = [
    meson
    ninja
    pkg-config
    (buildPackages.python3.withPackages (ps: [ ps.pyyaml ]))
  ];

  buildInputs = [
    libepoxy
    moltenvk
    vulkan-headers
  ];

  # 0.10.x: render-server off (no fork/exec server on macOS), drm disabled (no libdrm on macOS).
  mesonFlags = krunLib.virglrenderer.mesonFlags {
    version = pin.meson_version;
    venus = true;
    renderServer = false;
    drm = false;
  };

  separateDebugInfo = true;

  passthru.tests.exportsRenderer = runCommandCC "virglrenderer-venus-exports" { } ''
    $NM -g ${finalAttrs.finalPackage}/lib/libvirglrenderer${stdenv.hostPlatform.extensions.sharedLibrary} \
      | grep -q virgl_renderer_init
    touch $out
  '';

  meta = {
    description = "virglrenderer with Venus on MoltenVK (slp's krunkit fork)";
    homepage = "https://gitlab.freedesktop.org/slp/virglrenderer";
    license = lib.licenses.mit;
    platforms = lib.platforms.darwin;
  };
})
