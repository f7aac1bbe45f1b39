"""The macOS host: the krun bundle, podman machine + krunkit launch plans, run plans, serve, doctor checks.

May import: core, adapters, apir, bench, hosts, routes, serve.
"""
