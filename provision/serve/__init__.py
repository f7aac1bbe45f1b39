"""`provision serve`: llama-server in a guest, published on the host; `ps` and `stop` (state.py).

May import core, adapters and the hosts (a serve runs in a Linux QEMU guest or a podman container).
"""
