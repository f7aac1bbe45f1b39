"""Which stack and route fit this host: ``choose`` (pure: the host's facts in, a decision out).
Each host gathers its own facts (``Host.route_facts``); `provision run --gpu`, `serve --gpu`,
`bench` without a stack and `provision doctor` all print the same decision.

May import: core.
"""
