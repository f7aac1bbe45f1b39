"""checks/upstream-facts: facts read from the pinned upstream trees (see cli.py)."""
