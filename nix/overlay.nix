# The krun-gpu packages as an overlay. New attributes get names of their own (virglrenderer-apir,
# libkrun-gpu, krunkit-gpu, …) so applying the overlay does not rebuild qemu or other users of
# nixpkgs' virglrenderer/libkrun. Every version, rev and hash comes from provision/data/pins.json.
final: prev:
let
  krunLib = import ./lib { inherit (prev) lib; };
  pinsFile = ../provision/data/pins.json;
  pins = krunLib.pins.fromText "provision/data/pins.json" (builtins.readFile pinsFile);
  call = file: args: final.callPackage file ({ inherit krunLib; } // args);
  isDarwin = final.stdenv.hostPlatform.isDarwin;
  # macOS: the MR 1590 tree the Linux route proves plus our darwin patches (libkrun's macOS ABI),
  # linked as Mach-O by checks/macho-link. (CamouflageNetworks 8c349fc0 does not link there.)
  apirPinName = if isDarwin then "virglrenderer-apir-macos" else "virglrenderer-apir";
in
{
  krun-gpu-lib = krunLib;
  krun-gpu-pins = pins;

  # nixpkgs' MoltenVK, refused at evaluation unless its version is sources.moltenvk's.
  krun-moltenvk = krunLib.pins.sameVersion "moltenvk" (pins.source "moltenvk") prev.moltenvk;

  virglrenderer-venus = call ./pkgs/virglrenderer-venus.nix {
    pin = pins.source "virglrenderer-venus";
    moltenvk = final.krun-moltenvk;
  };

  virglrenderer-apir = call ./pkgs/virglrenderer-apir.nix {
    pinName = apirPinName;
    pin = pins.source apirPinName;
    moltenvk = final.krun-moltenvk;
  };

  # macOS Venus (the default route) links slp's krunkit virglrenderer, the tree and flags the libkrun
  # Homebrew tap and nixpkgs' libkrun-efi ship; Linux links the APIR tree (QEMU loads it).
  libkrun-gpu = call ./pkgs/libkrun-gpu.nix {
    pin = pins.source "libkrun";
    virglrenderer = if isDarwin then final.virglrenderer-venus else final.virglrenderer-apir;
  };

  krunkit-gpu = call ./pkgs/krunkit.nix {
    pin = pins.source "krunkit";
    inherit (pins.data) compat;
  };

  # macOS APIR, an output of its own: VIRGL_ROUTE_VENUS_TO_APIR breaks Venus for the whole VM, so
  # a Venus user never loads this virglrenderer (`provision launch --route apir` starts it).
  libkrun-gpu-apir = call ./pkgs/libkrun-gpu.nix {
    pin = pins.source "libkrun";
    virglrenderer = final.virglrenderer-apir;
    variant = "apir";
  };

  krunkit-gpu-apir = call ./pkgs/krunkit.nix {
    pin = pins.source "krunkit";
    inherit (pins.data) compat;
    libkrun-gpu = final.libkrun-gpu-apir;
  };

  ggml-virtgpu-backend = call ./pkgs/ggml-virtgpu-backend.nix { pin = pins.source "llama-cpp"; };

  krun = final.callPackage ./pkgs/krun.nix { route = if isDarwin then "venus" else "apir"; };

  krun-apir = final.callPackage ./pkgs/krun.nix {
    route = "apir";
    krunkit-gpu = final.krunkit-gpu-apir;
  };

  krun-provision = call ./pkgs/provision.nix { };
}
