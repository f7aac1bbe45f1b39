"""The host tools that run Linux guests: the Debian sid chroot with QEMU + virglrenderer
(host_tools.py: found, checked, made), the unprivileged user guests run as (guest_user.py), and
the relocatable bundle that carries the tools to a host without sid (bundle.py, its file format
bundle_archive.py) with guest disks cut to what runs (minimal_disk.py).

May import: core, adapters, images.
"""
