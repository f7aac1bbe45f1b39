"""One module per outside program or library (podman, qemu, chroot, xvfb, ...)."""
