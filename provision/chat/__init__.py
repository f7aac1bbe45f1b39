"""`provision chat`: an OpenAI-compatible chat against a served model (ours by name, or any URL).

May import: core, adapters; the CLI hands it the serve entries.
"""
