"""Benchmarks: llama-bench JSON turned into side-by-side tables, ratios, gates and plots, and the
bench history in one place: its records and comparisons (history.py), the file in the cache they
are kept in (history_file.py) and its append-only JSON Lines format (jsonl.py).

The runs belong to the hosts (``Host.bench``; hosts/linux/run/bench.py).

May import: core.
"""
