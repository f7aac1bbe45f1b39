"""Guest images: Containerfiles rendered from the catalog and pins, podman builds, the pinned source sdist.

May import: core, models, adapters.
"""
