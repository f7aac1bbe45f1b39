"""The macOS host: the krun bundle, podman machine + krunkit launch plans, run plans, doctor checks.

May import core, images and adapters; never the CLI or the Linux host.
"""
