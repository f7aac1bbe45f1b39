"""Benchmarks: llama-bench JSON turned into side-by-side tables, ratios, gates and plots.

May import core only; the runs themselves belong to the host backends.
"""
