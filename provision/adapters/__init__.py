"""Adapters: each module talks to exactly one outside program or library."""
