# Stub of nixpkgs pkgs/by-name/vi/virglrenderer/package.nix (1.2.x form: Linux-centric switches).
{
  lib,
  stdenv,
  fetchFromGitLab,
  meson ? null,
  ninja ? null,
  pkg-config ? null,
  libepoxy ? null,
  libdrm ? null,
  libgbm ? null,
  vulkan-headers ? null,
  vulkan-loader ? null,
  vulkanSupport ? stdenv.hostPlatform.isLinux,
  nativeContextSupport ? stdenv.hostPlatform.isLinux,
  vaapiSupport ? !stdenv.hostPlatform.isDarwin,
  ...
}:
stdenv.mkDerivation (finalAttrs: {
  pname = "virglrenderer";
  version = "0-stub";
  src = fetchFromGitLab {
    domain = "gitlab.freedesktop.org";
    owner = "virgl";
    repo = "virglrenderer";
    tag = finalAttrs.version;
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:virglrenderer-src";
  };
  nativeBuildInputs = [
    meson
    ninja
    pkg-config
  ];
  buildInputs = [
    libepoxy
    libdrm
    libgbm
  ]
  ++ lib.optionals vulkanSupport [
    vulkan-headers
    vulkan-loader
  ];
  mesonFlags = [
    (lib.mesonBool "video" vaapiSupport)
    (lib.mesonBool "venus" vulkanSupport)
    (lib.mesonOption "drm-renderers" (lib.optionalString nativeContextSupport "amdgpu-experimental,asahi,msm"))
  ];
  meta.platforms = lib.platforms.unix;
})
