"""The Linux host: QEMU + virglrenderer guests (host tools, disks, GPU slots, watchdog, the APIR
chroot build and loopback, serve, shell, bench, doctor checks).

May import: core, adapters, apir, bench, hosts, images, serve.
"""
