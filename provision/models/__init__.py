"""The model store: names and references, sha256-verified resumable pulls, the synthetic models.

May import: core, adapters.
"""
