"""Drive `provision chat` in a real pty (python's pty module): type a line once the screen shows
what the previous step waits for; the exit status and everything the terminal showed come back."""

from __future__ import annotations

import os
import pty
import select
import sys
import time


def pty_session(argv: list[str], inputs: list[str], want: list[str], timeout: float) -> tuple[int, str]:
    """Drive ``provision chat`` in a real pty: wait for each ``want`` text (each after the one before
    it on the screen), then type the next input; the last ``want`` comes after the last input."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI with the pty as its terminal
        os.execv(sys.executable, [sys.executable, "-m", "provision", *argv])
    seen = b""
    at = 0  # where on the screen the next want-text is looked for
    status: int | None = None
    deadline = time.monotonic() + timeout
    try:
        for text, expect in zip(inputs + [None], want, strict=True):
            while seen.find(expect.encode(), at) < 0:
                assert time.monotonic() < deadline, f"waited for {expect!r}; saw {seen.decode(errors='replace')!r}"
                ready, _, _ = select.select([fd], [], [], 1)
                if ready:
                    try:
                        chunk = os.read(fd, 4096)
                    except OSError:
                        chunk = b""
                    assert chunk, f"chat ended before {expect!r}: {seen.decode(errors='replace')!r}"
                    seen += chunk
            at = seen.find(expect.encode(), at) + len(expect)
            if text is not None:
                os.write(fd, text.encode() + b"\r")
        _, status = os.waitpid(pid, 0)
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if status is None:  # not reaped yet: it is still ours to kill
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")
