# virglrenderer with API Remoting (APIR) and Venus. Linux builds the MR 1590 head (1.2.0 + the
# APIR commits); macOS builds a 1.3.0-based tree that also carries the macOS APIR adaptation
# commits, which the MR head lacks (docs/nix.md). The meson flag list follows each tree's options;
# the pin's `patches` (ours, checked against the tree by checks/upstream-facts) are applied.
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

  # Linux: upstream's C23/glibc 2.43 build fixes the MR head lacks. macOS: the
  # virgl_renderer_resource_get_map_ptr that libkrun's rutabaga_gfx calls there.
  patches = map (p: ../.. + "/${p}") (pin.patches or [ ]);

  # macOS: libvulkan is dlopened (vulkan-dload); make its MoltenVK fallback an absolute store path.
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
