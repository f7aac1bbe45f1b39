"""The pure core: error codes, the pins file, the stack catalog and its rules, state paths.

May import only the standard library and third-party parsers; never adapters, hosts, domain packages or the CLI.
"""
