# TEST DOUBLE of the nixpkgs flake (see default.nix): the outputs the krun-gpu flake reads from
# its `nixpkgs` input, `lib` and `legacyPackages.<system>`, plus being importable as
# `import nixpkgs { system; overlays; }`. Used only through
#   --override-input nixpkgs path:<repo>/nix/tests/stub-nixpkgs
{
  description = "stub nixpkgs: evaluation-only test double for the krun-gpu flake tests";
  outputs =
    { self }:
    let
      lib = import ./lib.nix;
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs lib.systems.flakeExposed (system: import ./default.nix { inherit system; });
    };
}
