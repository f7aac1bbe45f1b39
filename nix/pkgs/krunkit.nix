# krunkit, our own derivation of the krunkit release that pairs with our libkrun (krunkit 1.3.x calls
# krun_add_virtiofs4, which libkrun only has from 1.19.x on, and cannot load libkrun 2.0), linked to
# libkrun-gpu. Not an override of nixpkgs' krunkit: that function's arguments change under us
# (`libkrun-efi` in the versions read; newer nixpkgs folds libkrun-efi into libkrun with a `variant`),
# so `.override { libkrun-efi = …; }` breaks on one side or the other (docs/nix.md).
# What the recipe relies on is in nix/facts/upstream.json, "krunkit": the Makefile's darwin steps
# (install_name_tool -change $(LIBKRUN) $(PREFIX)/lib/$(LIBKRUN), codesign --entitlements) and the
# firmware lookup <exe>/../share/krunkit/KRUN_EFI.silent.fd with the file shipped in edk2/.
{
  lib,
  stdenv,
  fetchurl,
  fetchFromGitHub,
  fetchFromGitLab,
  cargo,
  darwin,
  libepoxy,
  libkrun-gpu,
  pkg-config,
  runCommandCC,
  rustPlatform,
  rustc,
  krunLib,
  pin,
  compat,
}:
let
  # The Makefile re-points the binary's libkrun.1.dylib at $(PREFIX)/lib, which is krunkit's own
  # output here: point it at libkrun-gpu instead.
  libkrunRule = {
    from = "$(PREFIX)/lib/$(LIBKRUN)";
    to = "${libkrun-gpu}/lib/$(LIBKRUN)";
  };
in
assert krunLib.compat.checkKrunkitLibkrun compat.krunkit_libkrun pin.version libkrun-gpu.version;
stdenv.mkDerivation (finalAttrs: {
  pname = "krunkit";
  inherit (pin) version;

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } "krunkit" pin;

  cargoDeps = rustPlatform.fetchCargoVendor {
    inherit (finalAttrs) src;
    hash = pin.cargoHash;
  };

  postPatch = ''
    substituteInPlace Makefile --replace-fail ${lib.escapeShellArg libkrunRule.from} ${lib.escapeShellArg libkrunRule.to}
  '';

  nativeBuildInputs = [
    cargo
    darwin.sigtool # codesign, for the hypervisor entitlement
    pkg-config
    rustc
    rustPlatform.bindgenHook
    rustPlatform.cargoSetupHook
  ];

  buildInputs = [
    libepoxy
    libkrun-gpu
  ];

  makeFlags = [ "PREFIX=${placeholder "out"}" ];

  # The Makefile's release step (install_name_tool, codesign) runs once, in the build phase: its
  # `install` target depends on it again, and a later Makefile's `-add_rpath` fails on a second run
  # ("would duplicate path"). So install the signed binary as is.
  # krunkit looks for its firmware at <exe>/../share/krunkit/ (src/context.rs).
  installPhase = ''
    runHook preInstall
    install -Dm755 target/release/krunkit "$out/bin/krunkit"
    install -Dm444 edk2/KRUN_EFI.silent.fd "$out/${pin.firmware}"
    runHook postInstall
  '';

  # Stripping would drop the entitlements codesign attached.
  dontStrip = true;

  passthru = {
    libkrun = libkrun-gpu;
    inherit libkrunRule;
    firmware = "${finalAttrs.finalPackage}/${pin.firmware}";
    tests = {
      # The binary must load our libkrun by its store path, and find its firmware.
      linksLibkrunGpu = runCommandCC "krunkit-links-libkrun-gpu" { } ''
        otool -L ${finalAttrs.finalPackage}/bin/krunkit | grep -qF '${libkrun-gpu}/lib/libkrun'
        test -f ${finalAttrs.finalPackage}/${pin.firmware}
        ${finalAttrs.finalPackage}/bin/krunkit --version | grep -qF '${pin.version}'
        touch $out
      '';
    };
  };

  meta = {
    description = "Launch configurable virtual machines with libkrun (GPU-enabled libkrun of krun-gpu)";
    homepage = "https://github.com/libkrun/krunkit";
    license = lib.licenses.asl20;
    mainProgram = "krunkit";
    platforms = [ "aarch64-darwin" ];
  };
})
