"""``lsof``: which files a running process has mapped, to see which virglrenderer krunkit loaded.

The machine-readable form (``-F pcn``: one field per line, ``p`` pid, ``c`` command,
``n`` name) is what we run; the table form users paste from ``lsof -c krunkit`` is parsed
too. macOS lists dylibs with FD ``txt``, Linux lists shared objects with FD ``mem``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class OpenFile:
    pid: int
    command: str
    name: str


def command_cmd(command: str) -> list[str]:
    # -n/-P: no DNS or port-name lookups (slow, irrelevant); -w: no warnings about other FS.
    return ["lsof", "-n", "-P", "-w", "-c", command, "-F", "pcn"]


def parse_fields(output: str) -> list[OpenFile]:
    files: list[OpenFile] = []
    pid, cmd = -1, ""
    for line in output.splitlines():
        if not line:
            continue
        tag, value = line[0], line[1:]
        if tag == "p":
            pid, cmd = int(value), ""
        elif tag == "c":
            cmd = value
        elif tag == "n" and pid >= 0:
            files.append(OpenFile(pid, cmd, value))
    return files


_TABLE_ROW = re.compile(r"^(?P<cmd>\S+)\s+(?P<pid>\d+)\s+.*?\s(?P<name>/.*)$")


def parse_table(output: str) -> list[OpenFile]:
    """The default ``lsof -c krunkit`` table: COMMAND PID USER FD TYPE DEVICE SIZE/OFF NODE NAME."""
    files = []
    for line in output.splitlines()[1:]:
        m = _TABLE_ROW.match(line)
        if m:
            files.append(OpenFile(int(m.group("pid")), m.group("cmd"), m.group("name")))
    return files


def libraries_named(files: list[OpenFile], stem: str) -> list[str]:
    """Distinct paths whose file name starts with ``stem`` (e.g. ``libvirglrenderer``)."""
    seen: list[str] = []
    for f in files:
        base = f.name.rsplit("/", 1)[-1]
        if base.startswith(stem) and f.name not in seen:
            seen.append(f.name)
    return seen
