# Stub of nixpkgs pkgs/by-name/li/libkrun-efi/package.nix (aarch64-darwin; withGpu ? true).
{
  lib,
  stdenv,
  fetchFromGitHub,
  rustPlatform,
  cargo ? null,
  rustc ? null,
  pkg-config ? null,
  fixDarwinDylibNames ? null,
  libepoxy ? null,
  moltenvk ? null,
  withGpu ? true,
  ...
}:
stdenv.mkDerivation (finalAttrs: {
  pname = "libkrun-efi";
  version = "0-stub";
  src = fetchFromGitHub {
    owner = "libkrun";
    repo = "libkrun";
    tag = "v${finalAttrs.version}";
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:libkrun-efi-src";
  };
  cargoDeps = rustPlatform.fetchCargoVendor {
    inherit (finalAttrs) src;
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:libkrun-efi-cargo";
  };
  nativeBuildInputs = [
    cargo
    fixDarwinDylibNames
    pkg-config
    rustc
    rustPlatform.bindgenHook
    rustPlatform.cargoSetupHook
  ];
  buildInputs = [ libepoxy ];
  makeFlags = [
    "PREFIX=${placeholder "out"}"
    "EFI=1"
  ]
  ++ lib.optional withGpu "GPU=1";
  meta.platforms = [ "aarch64-darwin" ];
})
