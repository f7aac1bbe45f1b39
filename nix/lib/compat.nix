# Version pairs that are known to work or to break, from pins.json "compat" (one place).
{ lib }:
let
  majorMinor =
    v:
    let
      parts = builtins.splitVersion v;
    in
    "${builtins.elemAt parts 0}.${builtins.elemAt parts 1}";
in
{
  inherit majorMinor;

  # rules: pins.json compat.krunkit_libkrun, e.g. [ { krunkit = "1.3"; libkrun_min = "1.19.3";
  # libkrun_below = "2.0"; } ]. Returns true, or throws naming both versions and the rule.
  # (krunkit 1.3.x calls krun_add_virtiofs4, first in libkrun 1.19.x after 1.19.0, and cannot load
  # libkrun 2.0's C API.)
  checkKrunkitLibkrun =
    rules: krunkitVersion: libkrunVersion:
    let
      applicable = lib.filter (r: r.krunkit == majorMinor krunkitVersion) rules;
      bad = lib.filter (
        r: lib.versionOlder libkrunVersion r.libkrun_min || !(lib.versionOlder libkrunVersion r.libkrun_below)
      ) applicable;
    in
    if bad == [ ] then
      true
    else
      let
        r = lib.head bad;
      in
      throw "krun-gpu: krunkit ${krunkitVersion} needs libkrun >= ${r.libkrun_min} and < ${r.libkrun_below}, got libkrun ${libkrunVersion} (pins.json compat.krunkit_libkrun)";
}
