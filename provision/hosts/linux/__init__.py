"""The Linux host: QEMU + virglrenderer guests (host tools, disks, GPU slots, watchdog, doctor checks).

May import core, models, images, apir and adapters; never the CLI or the darwin host.
"""
