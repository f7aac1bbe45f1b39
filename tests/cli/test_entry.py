"""provision.cli.entry, the program's way out: what the interpreter's exit would do still happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# stdout block-buffered, as it is for a pipe unless PYTHONUNBUFFERED says otherwise
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}

# main() swapped for one that leaves work for the exit: a thread that is not a daemon, an atexit
# callback, a temporary directory (removed by its weakref finalizer) and unflushed stdout.
LEAVES_WORK = """
import atexit, sys, tempfile, threading, time
import provision.cli as cli

def main():
    def late():
        time.sleep(0.3)
        print("thread finished")
    threading.Thread(target=late).start()
    atexit.register(lambda: print("atexit ran"))
    global kept
    kept = tempfile.TemporaryDirectory(prefix="entry-test-")
    print(kept.name)
    sys.stdout.write("unflushed tail")
    return STATUS

cli.main = main
cli.entry()
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, env=ENV)


def test_entry_waits_for_threads_runs_atexit_and_finalizers_and_flushes() -> None:
    done = _run(LEAVES_WORK.replace("STATUS", "7"))
    assert done.returncode == 7, done.stderr
    tmp = Path(done.stdout.split("\n", 1)[0])
    assert tmp.name.startswith("entry-test-") and not tmp.exists()  # the finalizer removed it
    # stdout is a pipe, so block-buffered: all of it comes out in the exit's flush, in order
    assert done.stdout == f"{tmp}\nunflushed tailthread finished\natexit ran\n"
    assert done.stderr == ""


def test_entry_turns_system_exit_into_its_status() -> None:
    for raised, status, err in (("SystemExit('bad flag')", 1, "bad flag\n"), ("SystemExit(None)", 0, ""),
                                ("SystemExit(3)", 3, "")):
        code = f"import provision.cli as cli\ndef main(): raise {raised}\ncli.main = main\ncli.entry()\n"
        done = _run(code)
        assert (done.returncode, done.stderr) == (status, err), raised


def test_the_program_exits_with_main_s_status_and_whole_output() -> None:
    done = subprocess.run([sys.executable, "-m", "provision", "stacks", "--json"], capture_output=True, text=True,
                          timeout=60, cwd=REPO, env=ENV)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "ok"
    bad = subprocess.run([sys.executable, "-m", "provision", "model", "pull"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=ENV)
    assert bad.returncode == 13 and "E003" in bad.stderr and "Traceback" not in bad.stderr


def test_a_reader_that_went_away_is_exit_141_not_a_traceback() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "provision", "stacks"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before provision writes: its write meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(60) == 141
    assert err == ""



ONE_BUFFERED_WRITE = """
import sys, provision.cli as cli
def main():
    sys.stdout.write("x")  # into stdout's buffer: a pipe is block-buffered
    print("written", file=sys.stderr, flush=True)
    sys.stdin.readline()  # the test closes its end of stdout meanwhile
    return 0
cli.main = main
cli.entry()
"""


def test_output_left_in_the_buffer_for_a_reader_that_went_away_is_exit_141() -> None:
    proc = subprocess.Popen([sys.executable, "-c", ONE_BUFFERED_WRITE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=ENV)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    assert proc.stderr.readline() == "written\n"
    proc.stdout.close()
    proc.stdin.write("\n")
    proc.stdin.close()
    assert (proc.wait(60), proc.stderr.read()) == (141, "")  # the exit's flush met the closed pipe
