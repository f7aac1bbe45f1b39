"""The Linux host: QEMU + virglrenderer guests, behind the one Host protocol (host.py).

Here: the Host itself (host.py), `provision host-tools` (prepare.py), the doctor checks
(doctor.py, doctor_isolation.py) and the route facts this host probes (route_facts.py).
Beneath, one room per concern: ``run/`` runs a guest (request -> facts -> plan -> execute, and
serve, shell, bench, perplexity on top of it), ``tools/`` holds the host tools that run guests
(the sid chroot, the user guests run as, the relocatable bundle and its minimal disks),
``apir/`` the APIR route's host side built in those tools (and its loopback, no VM), ``vtest/``
Venus without a VM (virglrenderer's vtest server).

May import: core, adapters, bench, hosts, hosts.linux.apir, hosts.linux.run, hosts.linux.tools, images, routes, serve.
"""
