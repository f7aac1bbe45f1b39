# libkrun with GPU (virtio-gpu through virglrenderer), block and net devices: the build krunkit
# needs (krun_set_gpu_options2, krun_add_disk*, krun_add_net_unix*).
#   Linux: nixpkgs' libkrun with withGpu/withBlk/withNet, linked to our APIR virglrenderer.
#   macOS: nixpkgs has only the EFI variant (libkrun-efi.dylib with a private virglrenderer), so we
#          build libkrun.dylib ourselves from the pinned source, paired with the pinned krunkit.
{
  lib,
  stdenv,
  fetchurl,
  fetchFromGitHub,
  fetchFromGitLab,
  buildPackages,
  cargo,
  fixDarwinDylibNames,
  libepoxy,
  libkrun,
  pkg-config,
  rustPlatform,
  rustc,
  runCommandCC,
  rutabaga_gfx,
  virglrenderer,
  krunLib,
  pin,
  # "venus": linked to the krunkit virglrenderer (macOS default); "apir": to the APIR tree.
  variant ? "venus",
}:
let
  features = {
    gpu = true;
    blk = true;
    net = true;
  };

  # What krunkit calls, one symbol per Makefile switch we turn on.
  exportsTest =
    pkg:
    runCommandCC "libkrun-gpu-exports" { } ''
      for lib in ${pkg}/lib*/libkrun${stdenv.hostPlatform.extensions.sharedLibrary}; do
        $NM -g "$lib" > symbols
      done
      for sym in krun_set_gpu_options2 krun_add_disk krun_add_net_unix; do
        grep -q "$sym" symbols || { echo "libkrun lacks $sym" >&2; exit 1; }
      done
      touch $out
    '';

  linux =
    (libkrun.override {
      withGpu = features.gpu;
      withBlk = features.blk;
      withNet = features.net;
      inherit virglrenderer;
    }).overrideAttrs
      (
        finalAttrs: prev: {
          passthru = (prev.passthru or { }) // {
            tests = (prev.passthru.tests or { }) // {
              exports = exportsTest finalAttrs.finalPackage;
            };
          };
        }
      );

  src = krunLib.pins.fetch { inherit fetchurl fetchFromGitHub fetchFromGitLab; } "libkrun" pin;

  # The guest init that libkrun embeds, built static for the guest (aarch64 Linux) so the
  # Makefile neither downloads a Debian sysroot nor needs a Linux cross compiler of its own.
  initBinary = buildPackages.pkgsCross.aarch64-multiplatform.pkgsStatic.stdenv.mkDerivation {
    pname = "libkrun-init";
    inherit (pin) version;
    inherit src;
    dontConfigure = true;
    buildPhase = ''
      runHook preBuild
      cd src/init_blob/init
      $CC -O2 -static -Wall -o init init.c dhcp.c
      runHook postBuild
    '';
    installPhase = ''
      runHook preInstall
      install -D init $out/init
      runHook postInstall
    '';
  };

  makefileRules = [
    krunLib.libkrun.sysrootRule
    krunLib.libkrun.sameFileMoveRule
  ];

  darwin = stdenv.mkDerivation (finalAttrs: {
    pname = if variant == "apir" then "libkrun-gpu-apir" else "libkrun-gpu";
    inherit (pin) version;
    inherit src;

    outputs = [
      "out"
      "dev"
    ];

    cargoDeps = rustPlatform.fetchCargoVendor {
      inherit (finalAttrs) src;
      hash = pin.cargoHash;
    };

    # The Darwin library target depends on a downloaded Debian sysroot (and a FreeBSD init): drop
    # that dependency, the init comes from KRUN_INIT_BINARY_PATH. And its rename of libkrun.dylib
    # onto itself fails under GNU mv: skip it when the names agree (nix/lib/libkrun.nix).
    postPatch = lib.concatMapStrings (rule: ''
      substituteInPlace Makefile --replace-fail ${lib.escapeShellArg rule.from} ${lib.escapeShellArg rule.to}
    '') makefileRules;

    nativeBuildInputs = [
      cargo
      fixDarwinDylibNames
      pkg-config
      rustc
      rustPlatform.bindgenHook
      rustPlatform.cargoSetupHook
    ];

    buildInputs = [
      libepoxy
      rutabaga_gfx
      virglrenderer
    ];

    makeFlags = [ "PREFIX=${placeholder "out"}" ] ++ krunLib.libkrun.makeFlags features;

    env.KRUN_INIT_BINARY_PATH = "${initBinary}/init";

    passthru = {
      inherit initBinary virglrenderer makefileRules variant;
      tests = {
        exports = exportsTest finalAttrs.finalPackage;
        # fixDarwinDylibNames must have replaced the bare "libkrun.1.dylib" install name.
        installName = runCommandCC "libkrun-gpu-install-name" { } ''
          otool -D ${finalAttrs.finalPackage}/lib/libkrun.1.dylib | tail -n 1 \
            | grep -q '^${finalAttrs.finalPackage}/lib/'
          touch $out
        '';
      };
    };

    meta = {
      description = "libkrun with GPU, block and net devices, for krunkit";
      homepage = "https://github.com/libkrun/libkrun";
      license = lib.licenses.asl20;
      platforms = [ "aarch64-darwin" ];
    };
  });
in
if stdenv.hostPlatform.isLinux then linux else darwin
