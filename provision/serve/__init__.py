"""`provision serve`: llama-server in a guest, published on the host; `ps` and `stop` (state.py).

The guest itself comes from the host (``Host.serve_guest``: hosts/linux/run/serve.py, hosts/darwin/serve.py).

May import: core, adapters, images.
"""
