"""Cross-building the darwin C libraries of the bundle to real Mach-O arm64 with zig (checks/macho-link)."""
