"""The core: error codes, the pins file, the stack catalog and its rules, checks as data, the
settings, the cache layout, results and their envelope, logging, files written whole, locks.

No subprocess and no network here; the I/O is reading the project's own data files and the
config files, making the cache and state directories, writing files whole, and holding lock files.

May import: nothing.
"""
