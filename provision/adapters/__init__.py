"""Adapters: each module talks to one outside program or library (podman, QEMU, HTTP, ctypes …),
plus the owned process tree (procs.py) and the one way to run a program on it (runner.py).

May import: core.
"""
