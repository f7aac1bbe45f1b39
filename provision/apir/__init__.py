"""The APIR host side: ggml builds of the host backend, the ctypes preflight, virglrenderer with APIR.

May import core, images (the pinned sources) and adapters; never the CLI.
"""
