"""The Linux host: QEMU + virglrenderer guests (host tools, disks, GPU slots, watchdog, the APIR
chroot build and loopback, serve, shell, bench, doctor checks).

A run is one RunRequest -> facts.gather -> runplan.plan_run (the final command line,
environment, user and root) -> execute.execute.

May import: core, adapters, apir, bench, hosts, images, routes, serve.
"""
