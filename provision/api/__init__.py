"""The HTTP execution API (`provision api`): POST a shell snippet, get it run in a fresh guest.

Pure parts (settings, auth, the error -> HTTP status table, the job runner) import no web
framework; ``app`` and ``server`` import FastAPI and uvicorn, so only `provision api` pays for them.

May import: core, models, hosts.
"""
