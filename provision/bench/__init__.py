"""Benchmarks: llama-bench JSON turned into side-by-side tables, ratios, gates and plots.

The runs belong to the hosts (``Host.bench``; hosts/linux/bench_run.py).

May import: core.
"""
