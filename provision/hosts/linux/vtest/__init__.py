"""Venus without a VM: virglrenderer's vtest server, built with our patch (server.py), and Mesa's
venus driver talking to it over a socket (venus.py), so the Venus route's own cost is seen
without QEMU or a guest.

May import: core, adapters, apir, hosts.linux.apir, hosts.linux.tools.
"""
