"""The reaper: stops a provision process's children once that process is gone, however it went.

Started by ``procs`` as ``python -m provision.adapters.reaper OWNER_PID OWNER_START`` in a session of
its own, with stdin the read end of a pipe only the owner can write to. Each line names a run
directory the owner records children in. End of file means the owner has exited or was killed
(SIGKILL included: the kernel closes its end): every record in those directories that still
names that owner is stopped (SIGTERM to its process group, SIGKILL after 3 s) and dropped. A
provision that ended cleanly has dropped its records already, so the reaper just exits.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from pathlib import Path

from provision.adapters import runner


def main(argv: list[str]) -> int:
    # Terminal signals are meant for provision; the reaper must outlive it to do its work.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    owner = (int(argv[0]), int(argv[1]))
    dirs: list[Path] = []
    for line in sys.stdin.buffer:
        path = Path(line.decode(errors="replace").rstrip("\n"))
        if path not in dirs:
            dirs.append(path)
    for d in dirs:
        stopped = runner.stop_run(d, owner=owner)
        if stopped:  # a trace for whoever wonders what ended these processes
            with contextlib.suppress(OSError), (d / "reaper.log").open("a") as log:
                names = ", ".join(f"{r.name} {r.pid}" for r in stopped)
                log.write(f"{time.strftime('%H:%M:%S')} provision {owner[0]} is gone; stopped {names}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
