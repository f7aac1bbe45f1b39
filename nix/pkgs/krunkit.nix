# nixpkgs' krunkit, re-pinned to the krunkit release that pairs with our libkrun (krunkit 1.3.x
# calls krun_add_virtiofs4, which libkrun only has from 1.19.x on, and cannot load libkrun 2.0),
# and linked to libkrun-gpu instead of libkrun-efi. The firmware stays where krunkit looks for it:
# <prefix>/share/krunkit next to <prefix>/bin/krunkit.
{
  lib,
  fetchurl,
  fetchFromGitHub,
  fetchFromGitLab,
  krunkit,
  libkrun-gpu,
  runCommandCC,
  rustPlatform,
  krunLib,
  pin,
  compat,
}:
assert krunLib.compat.checkKrunkitLibkrun compat.krunkit_libkrun pin.version libkrun-gpu.version;
(krunkit.override { libkrun-efi = libkrun-gpu; }).overrideAttrs (
  finalAttrs: prev: {
    inherit (pin) version;
    src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } "krunkit" pin;
    cargoDeps = rustPlatform.fetchCargoVendor {
      inherit (finalAttrs) src;
      hash = pin.cargoHash;
    };

    # nixpkgs installs the firmware in postInstall; fail the build if a future krunkit moves it.
    postInstall = (prev.postInstall or "") + ''
      test -f "$out/${pin.firmware}" || { echo "krunkit: firmware not at $out/${pin.firmware}" >&2; exit 1; }
    '';

    passthru = (prev.passthru or { }) // {
      libkrun = libkrun-gpu;
      firmware = "${finalAttrs.finalPackage}/${pin.firmware}";
      tests = {
        # The binary must load our libkrun (absolute install name), not a libkrun-efi.
        linksLibkrunGpu = runCommandCC "krunkit-links-libkrun-gpu" { } ''
          otool -L ${finalAttrs.finalPackage}/bin/krunkit | grep -q '${libkrun-gpu}/lib/libkrun'
          test -f ${finalAttrs.finalPackage}/${pin.firmware}
          touch $out
        '';
      };
    };
  }
)
