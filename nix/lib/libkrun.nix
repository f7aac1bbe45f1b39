# libkrun's Makefile switches. krunkit calls krun_add_disk* (gated on `blk`), krun_add_net_unix*
# (gated on `net`) and krun_set_gpu_options2 (`gpu`), so a libkrun for krunkit needs all three.
{ lib }:
{
  makeFlags =
    {
      blk ? false,
      net ? false,
      gpu ? false,
      timesync ? false,
    }:
    lib.optional blk "BLK=1"
    ++ lib.optional net "NET=1"
    ++ lib.optional gpu "GPU=1"
    ++ lib.optional timesync "TIMESYNC=1";

  # The Makefile line that makes the Darwin library depend on a downloaded Debian sysroot (and a
  # FreeBSD init); the guest init comes from KRUN_INIT_BINARY_PATH instead (pins.md section 3).
  sysrootRule = {
    from = "$(LIBRARY_RELEASE_$(OS)): $(SYSROOT_TARGET) $(INIT_BINARY_BSD)";
    to = "$(LIBRARY_RELEASE_$(OS)):";
  };

  # Without a variant (no EFI=1) the Darwin release step renames libkrun.dylib onto itself:
  # KRUN_BASE_Darwin is libkrun$(VARIANT).dylib (nix/facts/upstream.json, libkrun.makefile). BSD mv
  # shrugs that off, GNU mv (the Nix build environment's) exits 1 "are the same file"; so rename
  # only when the names differ.
  sameFileMoveRule = {
    from = "mv target/release/libkrun.dylib target/release/$(KRUN_BASE_$(OS))";
    to = "test target/release/libkrun.dylib = target/release/$(KRUN_BASE_$(OS)) || mv target/release/libkrun.dylib target/release/$(KRUN_BASE_$(OS))";
  };
}
