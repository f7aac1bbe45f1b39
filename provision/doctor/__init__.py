"""`provision doctor`: this host's checks (``hosts.native().doctor_checks``) and the APIR preflight,
gathered as data (id, status, evidence, fix), and the settings in force with their sources.

May import: core, apir, hosts, routes.
"""
