# Stub of nixpkgs pkgs/by-name/kr/krunkit/package.nix: links the `libkrun-efi`
# argument, installs the EFI firmware to share/krunkit, keeps entitlements (dontStrip).
{
  lib,
  stdenv,
  fetchFromGitHub,
  callPackage ? null,
  cargo ? null,
  darwin ? null,
  libepoxy ? null,
  libkrun-efi ? null,
  nix-update-script ? null,
  pkg-config ? null,
  rustPlatform,
  rustc ? null,
  ...
}:
stdenv.mkDerivation (finalAttrs: {
  pname = "krunkit";
  version = "0-stub";
  src = fetchFromGitHub {
    owner = "libkrun";
    repo = "krunkit";
    tag = "v${finalAttrs.version}";
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:krunkit-src";
  };
  nativeBuildInputs = [
    cargo
    darwin.sigtool
    pkg-config
    rustc
    rustPlatform.bindgenHook
    rustPlatform.cargoSetupHook
  ];
  buildInputs = [
    libepoxy
    libkrun-efi
  ];
  makeFlags = [ "PREFIX=${placeholder "out"}" ];
  postInstall = ''
    install -Dm444 edk2/KRUN_EFI.silent.fd $out/share/krunkit/KRUN_EFI.silent.fd
  '';
  cargoDeps = rustPlatform.fetchCargoVendor {
    inherit (finalAttrs) src;
    sha256 = builtins.hashString "sha256" "stub-nixpkgs:krunkit-cargo";
  };
  dontStrip = true;
  passthru.updateScript = nix-update-script { };
  meta = {
    platforms = [ "aarch64-darwin" ];
    mainProgram = "krunkit";
  };
})
