"""Adapters: each module talks to exactly one outside program or library (podman, QEMU, HTTP, ctypes …).

May import core only; never a host, a domain package or the CLI.
"""
