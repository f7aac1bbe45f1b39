"""The APIR route's host-neutral logic: ggml builds of the host backend, the ctypes preflight, the
protocol, virglrenderer-APIR sources, the route's environment. The Linux chroot build of the
APIR host and the loopback live in hosts/linux/apir/.

May import: core, images, adapters.
"""
