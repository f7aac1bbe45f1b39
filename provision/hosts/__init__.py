"""Host backends (darwin: podman machine + krunkit; linux: QEMU + virglrenderer)."""
