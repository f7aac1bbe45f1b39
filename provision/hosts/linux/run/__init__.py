"""Running a Linux guest: one RunRequest -> facts.gather (what the host has) -> runplan.plan_run
(the final command line, environment, user and root) -> execute.execute, which starts exactly
that plan and watches it (watch.py, render_workers.py, companions.py) under a GPU slot (slots.py).
serve, shell, bench and perplexity build requests and run them here.

May import: core, adapters, apir, bench, hosts, hosts.linux.apir, hosts.linux.tools, images, serve.
"""
