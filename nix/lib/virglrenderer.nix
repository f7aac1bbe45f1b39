# Meson flags for virglrenderer, built from what the source tree actually declares.
#
# virglrenderer's meson_options.txt changed across the trees we build:
#   0.10.x (slp's krunkit fork)      declares `drm` (feature) and `render-server` (bool); no `apir`.
#   1.2.x  (MR 1590 head, c62e4b08)  no `drm`; `render-server` is deprecated (venus/apir force it on);
#                                    declares `apir` and `vulkan-dload`.
#   1.3.x  (CamouflageNetworks tree) neither `drm` nor `render-server`; declares `apir`, `vulkan-dload`
#                                    (default true: `false` there means meson's dependency('vulkan'),
#                                    which nixpkgs' moltenvk cannot satisfy: no vulkan.pc, no libvulkan).
# Meson rejects an undeclared -D option, so the flag list is derived from the version and an option
# the tree does not declare is never passed. A request the tree cannot honour is an error, not a
# silently dropped flag.
{ lib }:
let
  # The option set of each series we know; anything else is refused rather than guessed.
  series =
    version:
    if lib.versionAtLeast version "0.10" && lib.versionOlder version "0.11" then
      {
        name = "0.10";
        drm = true;
        renderServer = "option";
        apir = false;
        vulkanDload = false;
      }
    else if lib.versionAtLeast version "1.2" && lib.versionOlder version "1.3" then
      {
        name = "1.2";
        drm = false;
        renderServer = "deprecated";
        apir = true;
        vulkanDload = true;
      }
    else if lib.versionAtLeast version "1.3" && lib.versionOlder version "1.4" then
      {
        name = "1.3";
        drm = false;
        renderServer = "absent";
        apir = true;
        vulkanDload = true;
      }
    else
      throw "krun-gpu: no known meson option set for virglrenderer ${version} (known: 0.10.x, 1.2.x, 1.3.x); read its meson_options.txt and extend nix/lib/virglrenderer.nix";
in
{
  inherit series;

  # The darwin APIR tree with vulkan-dload on dlopens "libMoltenVK.dylib" first (our patch 0003,
  # src/venus/vkr_library.c), a bare name nothing in a Nix profile puts on dyld's search path:
  # point it at the store.
  moltenvkDlopenRule = libMoltenVK: {
    file = "src/venus/vkr_library.c";
    from = ''"libMoltenVK.dylib"'';
    to = ''"${libMoltenVK}"'';
  };

  # mesonFlags for a virglrenderer tree of `version` (the version in its meson.build).
  #   venus, apir: enable those contexts.
  #   drm: the 0.10.x `drm` feature (native DRM contexts); later trees have no such switch, so
  #        `false` is simply satisfied there and `true` is refused.
  #   renderServer: only 0.10.x lets us turn the render server off; in 1.2.x the option is a
  #        deprecated no-op and in 1.3.x it is gone, so `false` is not passed there.
  #   vulkanDload: null leaves the tree's default; a bool is passed only where declared.
  mesonFlags =
    {
      version,
      venus ? true,
      apir ? false,
      drm ? false,
      renderServer ? false,
      vulkanDload ? null,
    }:
    let
      s = series version;
    in
    assert lib.assertMsg (
      !apir || s.apir
    ) "krun-gpu: virglrenderer ${version} has no `apir` option; APIR needs the MR 1590 tree (1.2.x) or later";
    assert lib.assertMsg (
      !drm || s.drm
    ) "krun-gpu: virglrenderer ${version} has no `drm` option (use drm-renderers on 1.x)";
    assert lib.assertMsg (
      vulkanDload == null || s.vulkanDload
    ) "krun-gpu: virglrenderer ${version} has no `vulkan-dload` option";
    [ (lib.mesonBool "venus" venus) ]
    ++ lib.optional s.apir (lib.mesonBool "apir" apir)
    ++ lib.optional (s.renderServer == "option") (lib.mesonBool "render-server" renderServer)
    ++ lib.optional s.drm (lib.mesonEnable "drm" drm)
    ++ lib.optional (vulkanDload != null) (lib.mesonBool "vulkan-dload" vulkanDload);
}
