# Reading provision/data/pins.json, the one place for upstream versions, revs and hashes.
# A pin whose status is UNVERIFIED makes whatever uses it fail with a message that names it;
# READ, COMPUTED and VERIFIED pins are usable.
{ lib }:
let
  usable = [
    "VERIFIED"
    "COMPUTED"
    "READ"
  ];

  check =
    file: key: entry:
    if !(entry ? status) then
      throw "krun-gpu: ${key} in ${file} has no status"
    else if entry.status == "UNVERIFIED" then
      throw "krun-gpu: ${key} in ${file} is UNVERIFIED (${entry.provenance or "no provenance"}); refusing to build from it. Verify it and set its status."
    else if !(lib.elem entry.status usable) then
      throw "krun-gpu: ${key} in ${file} has unknown status '${entry.status}' (known: UNVERIFIED, ${lib.concatStringsSep ", " usable})"
    else
      entry;

  # Arguments for the nixpkgs fetcher named in the pin; a pin with a `rev` is fetched by rev even
  # when it also records its tag (the rev is the stronger identity).
  fetcherArgs =
    key: pin:
    let
      common = {
        inherit (pin) hash;
      };
      gitRef = if pin ? rev then { inherit (pin) rev; } else { inherit (pin) tag; };
    in
    if pin.fetcher == "fetchFromGitHub" then
      common // { inherit (pin) owner repo; } // gitRef
    else if pin.fetcher == "fetchFromGitLab" then
      common // { inherit (pin) domain owner repo; } // gitRef
    else if pin.fetcher == "fetchurl" then
      common // { inherit (pin) url; }
    else if pin.fetcher == "fetchPypi" then
      common // { inherit (pin) pname version; }
    else
      throw "krun-gpu: ${key} names fetcher '${pin.fetcher}', which nix/lib/pins.nix does not know";
in
{
  inherit usable check fetcherArgs;

  # load : string (a file's text) -> string (its name, for messages) -> pins
  fromText =
    file: text:
    let
      data = builtins.fromJSON text;
    in
    {
      inherit data file;
      # The pin of a source; throws if nobody could verify it.
      source =
        name:
        check file "sources.${name}" (
          data.sources.${name} or (throw "krun-gpu: sources.${name}: no such pin in ${file}")
        );
      # The locked nixpkgs the flake uses (flake.lock must agree; a test checks).
      nixpkgs = check file "nixpkgs" data.nixpkgs;
    };

  # nixpkgs' own package where a pin records the version the bundle was checked against
  # (sources.moltenvk): the package when its version is the pin's, else an evaluation error that
  # names both, so a nixpkgs with another version is never taken silently.
  sameVersion =
    name: pin: pkg:
    if pkg.version == pin.version then
      pkg
    else
      throw "krun-gpu: nixpkgs' ${name} is ${pkg.version}, but sources.${name} in provision/data/pins.json is ${pin.version}, the version the bundle was checked against. Fix: lock a nixpkgs whose ${name} is ${pin.version} (flake.lock and pins.json nixpkgs), or move sources.${name} (version, tag, rev, hash) to ${pkg.version} from a public recipe";

  # The `src` of a pin, using the fetchers of the package set that builds it.
  fetch =
    fetchers: name: pin:
    let
      f = fetchers.${pin.fetcher} or (throw "krun-gpu: no fetcher ${pin.fetcher} for sources.${name}");
    in
    f (fetcherArgs "sources.${name}" pin);
}
