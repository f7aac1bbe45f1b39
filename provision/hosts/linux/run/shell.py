"""`provision shell` on Linux: an interactive shell in a guest, on the user's terminal.

provision makes a pty pair; QEMU opens its slave as the guest's ttyS1 (VmSpec.terminal). The
job, started by the guest's init like any `provision run` job (same devices, same env), makes
ttyS1 its controlling terminal and execs ``bash -i``. provision copies bytes between its own
terminal (in raw mode) and the pty master, so echo, line editing and Ctrl-C belong to the
guest. Ctrl-] leaves at once (the guest is stopped), like telnet's escape.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shlex
import shutil
import signal
import sys
import termios
import threading
import tty
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from provision.core.errors import VmFailed
from provision.hosts import RunIO, RunRequest

ESCAPE = b"\x1d"  # Ctrl-]
GUEST_TTY = "/dev/ttyS1"
PLANNED_TERMINAL = "/dev/pts/made-at-run-time"  # what a dry run shows for the pty provision makes


def terminate(pid: int) -> None:
    """SIGTERM QEMU (shell, serve): the run's own cleanup then ends as on Ctrl-C."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def shell_command(term: str, rows: int, cols: int) -> list[str]:
    """The guest command: ttyS1 becomes the controlling terminal of an interactive shell."""
    if not re.fullmatch(r"[\w.+-]{1,64}", term):
        term = "vt100"
    script = (
        f"exec <{GUEST_TTY} >{GUEST_TTY} 2>&1; stty sane rows {int(rows)} cols {int(cols)}; "
        f'export TERM={shlex.quote(term)}; cd "$HOME"; '
        "if command -v bash >/dev/null; then exec setsid -w -c bash -i; fi; exec setsid -w -c sh -i"
    )
    return ["sh", "-c", script]


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """``fd`` in raw mode while inside (when it is a terminal), restored on every way out."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class Relay:
    """Copies user input to the pty master and guest output to the user, in a thread."""

    def __init__(self, master: int, stdin: int, stdout: int) -> None:
        self.master, self.stdin, self.stdout = master, stdin, stdout
        self.done = threading.Event()
        self.escaped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shell-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        watch = [self.master, self.stdin]
        while not self.done.is_set():
            ready, _, _ = select.select(watch, [], [], 0.2)
            if self.master in ready:
                self._copy_out()
            if self.stdin in ready:
                data = os.read(self.stdin, 4096)
                if not data:
                    watch = [self.master]  # input ended; the guest's output still shows
                elif ESCAPE in data:
                    self.escaped.set()
                    return
                else:
                    os.write(self.master, data)
        self._copy_out()  # what the guest wrote last

    def _copy_out(self) -> None:
        while select.select([self.master], [], [], 0)[0]:
            try:
                data = os.read(self.master, 4096)
            except OSError:
                return
            if not data:
                return
            os.write(self.stdout, data)

    def stop(self) -> None:
        self.done.set()
        self._thread.join(timeout=5)


def shell_request(req: RunRequest, terminal: str) -> RunRequest:
    """The guest run of a shell: its command sized to this terminal, its ttyS1 the pty ``terminal``."""
    size = shutil.get_terminal_size((80, 24))
    command = shell_command(os.environ.get("TERM", "vt100"), size.lines, size.columns)
    return replace(req, command=tuple(command), terminal=terminal)


def run_shell(req: RunRequest) -> int:
    """The guest's shell on this terminal; returns the shell's exit status."""
    from provision.hosts.linux.run import execute

    master, slave = os.openpty()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    qemu_pid: list[int] = []
    relay = Relay(master, stdin, stdout)

    def say(text: str) -> None:  # the terminal is raw: end lines with CR LF
        sys.stderr.write(f"provision: {text}\r\n")
        sys.stderr.flush()

    def started(pid: int, run_dir: Path) -> None:
        qemu_pid.append(pid)
        if relay.escaped.is_set():
            terminate(pid)

    shell_req = shell_request(req, os.ttyname(slave))
    say(f"shell in a {req.stack.name} guest{' with the GPU' if req.gpu else ''}; `exit` or Ctrl-] leaves")
    watcher = threading.Thread(target=_stop_on_escape, args=(relay, qemu_pid), daemon=True)
    try:
        with raw_terminal(stdin):
            relay.start()
            watcher.start()
            try:
                result = execute.run(shell_req, RunIO(on_start=started, say=say))
            except VmFailed:
                if relay.escaped.is_set():
                    say("left the shell (Ctrl-]); the guest was stopped")
                    return 130
                raise
            finally:
                relay.stop()
        return result.exit_status
    finally:
        os.close(master)
        os.close(slave)


def _stop_on_escape(relay: Relay, qemu_pid: list[int]) -> None:
    """Ctrl-] stops QEMU; the run's own cleanup then ends as on Ctrl-C."""
    while not relay.done.is_set():
        if relay.escaped.wait(0.5):
            if qemu_pid:  # the latest: a guest whose init never started is booted again
                terminate(qemu_pid[-1])
            return
