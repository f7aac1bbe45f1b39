# Stub of nixpkgs pkgs/by-name/mo/moltenvk/package.nix: outputs out/bin/dev; what it installs
# (lib/libMoltenVK.dylib and the ICD json, no .pc file) is in nix/facts/upstream.json.
{
  stdenv,
  ...
}:
stdenv.mkDerivation {
  pname = "moltenvk";
  # the locked nixpkgs' MoltenVK as sources.moltenvk records it (the overlay refuses another)
  version = "1.4.1";
  outputs = [
    "out"
    "bin"
    "dev"
  ];
}
