# Pure helpers of the krun-gpu flake: no packages, no I/O beyond what the caller hands in.
# Each is unit-tested by nix/lib/tests.nix (nix-instantiate --eval --strict).
{ lib }:
{
  virglrenderer = import ./virglrenderer.nix { inherit lib; };
  ggml = import ./ggml.nix { inherit lib; };
  libkrun = import ./libkrun.nix { inherit lib; };
  pins = import ./pins.nix { inherit lib; };
  python = import ./python.nix { inherit lib; };
  compat = import ./compat.nix { inherit lib; };
}
