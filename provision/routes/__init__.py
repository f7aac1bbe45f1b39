"""Which stack and route fit this host: ``choose`` (pure: facts in, decision out) and
``probe`` (the adapter that gathers the facts: render nodes, NVIDIA GPUs, Vulkan ICDs, the
APIR host builds, the krun bundle). `provision run --gpu`, `serve --gpu`, `bench` without a
stack and `provision doctor` all print the same decision.

May import: core, adapters, hosts.darwin, hosts.linux; only ``probe`` reads the host, ``choose`` imports core alone.
"""
