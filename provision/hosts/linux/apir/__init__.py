"""The APIR route's host side on Linux: virglrenderer-APIR and the host ggml built in the host-tools
chroot (host_side.py), and the APIR loopback that joins the guest frontend to the host backend in
one process, without a VM, in the chroot or on a host's own directories (loopback.py,
loopback_no_chroot.py). What does not depend on Linux is in provision/apir/.

May import: core, adapters, apir, hosts.linux.tools, images.
"""
