"""`provision doctor`: every host's checks gathered as data (id, status, evidence, fix).

May import core, hosts and apir (their check providers); never the CLI.
"""
