# Stub of nixpkgs pkgs/by-name/mo/moltenvk/package.nix: outputs out/bin/dev; what it installs
# (lib/libMoltenVK.dylib and the ICD json, no .pc file) is in nix/facts/upstream.json.
{
  stdenv,
  ...
}:
stdenv.mkDerivation {
  pname = "moltenvk";
  version = "0-stub";
  outputs = [
    "out"
    "bin"
    "dev"
  ];
}
