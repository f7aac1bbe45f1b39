# Stub of nixpkgs pkgs/by-name/li/libkrun/package.nix: the same arguments and the same mapping of
# the with* switches to Makefile flags (PREFIX, then BLK, NET, GPU, SND, INPUT, TIMESYNC, SEV, TDX).
{
  lib,
  stdenv,
  fetchFromGitHub,
  rustPlatform,
  cargo ? null,
  pkg-config ? null,
  glibc ? null,
  openssl ? null,
  libepoxy ? null,
  libdrm ? null,
  pipewire ? null,
  virglrenderer ? null,
  libkrunfw ? null,
  rustc ? null,
  withBlk ? false,
  withNet ? false,
  withGpu ? false,
  withSound ? false,
  withInput ? false,
  withTimesync ? false,
  variant ? null,
  ...
}:
assert lib.elem variant [
  null
  "sev"
  "tdx"
];
stdenv.mkDerivation (finalAttrs: {
  pname = "libkrun" + lib.optionalString (variant != null) "-${variant}";
  version = "0-stub";
  src = fetchFromGitHub {
    owner = "containers";
    repo = "libkrun";
    tag = "v${finalAttrs.version}";
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:libkrun-src";
  };
  outputs = [
    "out"
    "dev"
  ];
  cargoDeps = rustPlatform.fetchCargoVendor {
    inherit (finalAttrs) src;
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:libkrun-cargo";
  };
  nativeBuildInputs = [
    rustPlatform.cargoSetupHook
    rustPlatform.bindgenHook
    cargo
    rustc
  ]
  ++ lib.optional (variant != null || withGpu) pkg-config;
  buildInputs = [
    libkrunfw
    glibc
    glibc.static
  ]
  ++ lib.optionals withGpu [
    libepoxy
    libdrm
    virglrenderer
  ]
  ++ lib.optional withSound pipewire
  ++ lib.optional (variant != null) openssl;
  makeFlags = [
    "PREFIX=${placeholder "out"}"
  ]
  ++ lib.optional withBlk "BLK=1"
  ++ lib.optional withNet "NET=1"
  ++ lib.optional withGpu "GPU=1"
  ++ lib.optional withSound "SND=1"
  ++ lib.optional withInput "INPUT=1"
  ++ lib.optional withTimesync "TIMESYNC=1"
  ++ lib.optional (variant == "sev") "SEV=1"
  ++ lib.optional (variant == "tdx") "TDX=1";
  meta.platforms = lib.platforms.linux;
})
