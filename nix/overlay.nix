# The krun-gpu packages as an overlay. New attributes get names of their own (virglrenderer-apir,
# libkrun-gpu, krunkit-gpu, …) so applying the overlay does not rebuild qemu or other users of
# nixpkgs' virglrenderer/libkrun. Every version, rev and hash comes from provision/data/pins.json.
final: prev:
let
  krunLib = import ./lib { inherit (prev) lib; };
  pinsFile = ../provision/data/pins.json;
  pins = krunLib.pins.fromText "provision/data/pins.json" (builtins.readFile pinsFile);
  call = file: args: final.callPackage file ({ inherit krunLib; } // args);
  apirPinName =
    if final.stdenv.hostPlatform.isDarwin then "virglrenderer-apir-darwin" else "virglrenderer-apir";
in
{
  krun-gpu-lib = krunLib;
  krun-gpu-pins = pins;

  virglrenderer-venus = call ./pkgs/virglrenderer-venus.nix { pin = pins.source "virglrenderer-venus"; };

  virglrenderer-apir = call ./pkgs/virglrenderer-apir.nix {
    pinName = apirPinName;
    pin = pins.source apirPinName;
  };

  libkrun-gpu = call ./pkgs/libkrun-gpu.nix {
    pin = pins.source "libkrun";
    virglrenderer = final.virglrenderer-apir;
  };

  krunkit-gpu = call ./pkgs/krunkit.nix {
    pin = pins.source "krunkit";
    inherit (pins.data) compat;
  };

  ggml-virtgpu-backend = call ./pkgs/ggml-virtgpu-backend.nix { pin = pins.source "llama-cpp"; };

  krun = final.callPackage ./pkgs/krun.nix { };

  krun-provision = call ./pkgs/provision.nix { };
}
