"""The job runner's parts that need no guest: the guest command's quoting, output lines, and the
cancel event the Linux backend's watch loop and GPU-slot wait now honour (real processes, real flocks)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from provision.api.jobs import LineSink, guest_command, read_device
from provision.core import catalog
from provision.core.errors import RunCancelled
from provision.hosts.linux.run import runplan as linux
from provision.hosts.linux.run import slots, watch

TRICKY = """printf '%s\\n' "it's" "a \\"b\\"" '$HOME' "$(echo sub)"; echo 'two
lines'; exit 5"""


def test_the_code_reaches_sh_c_byte_for_byte(tmp_path: Path) -> None:
    """The job script the guest runs, run here by the same sh: quoting cannot break out of the code."""
    script = linux.job_script(catalog.load().get("cpu"), guest_command(TRICKY, probe_venus=False), None, False)
    (tmp_path / "job.sh").write_text(script)
    proc = subprocess.run(["sh", str(tmp_path / "job.sh")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 5
    assert proc.stdout == 'it\'s\na "b"\n$HOME\nsub\ntwo\nlines\n'


def test_the_venus_probe_goes_to_the_console_not_the_output() -> None:
    command = guest_command("echo hi", probe_venus=True)
    assert command[:2] == ["sh", "-c"] and command[-1] == "echo hi"
    assert "vulkaninfo --summary" in command[2] and "> /dev/console" in command[2]


def test_read_device_takes_the_console_marker(tmp_path: Path) -> None:
    (tmp_path / "console.log").write_bytes(b"KRUN-INIT up=1\nKRUN-DEVICE=Virtio-GPU Venus (llvmpipe)\r\nKRUN-EXIT=0\n")
    assert read_device(tmp_path) == "Virtio-GPU Venus (llvmpipe)"
    (tmp_path / "console.log").write_bytes(b"KRUN-DEVICE=none\n")
    assert read_device(tmp_path) is None


def test_line_sink_emits_whole_lines_in_order_and_caps_its_copy() -> None:
    events: list[dict] = []
    sink = LineSink("stdout", events.append, cap=8)
    for chunk in (b"ab", b"c\nde", b"f\ng\n", b"tail"):
        sink.write(chunk)
    assert [e["data"] for e in events] == ["abc\n", "def\n", "g\n"]
    sink.finish()
    assert events[-1]["data"] == "tail"
    assert sink.text() == "abc\ndef\n" and sink.truncated


def test_cancel_stops_the_watched_process_with_e026(tmp_path: Path) -> None:
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    start = time.monotonic()
    with pytest.raises(RunCancelled) as info:
        watch.watch(proc, tmp_path, time.monotonic() + 300, Sink(), Sink(), cancel=cancel)
    assert time.monotonic() - start < 10
    assert proc.poll() is not None and f"pid {proc.pid}" in info.value.message


def test_cancel_ends_the_wait_for_a_gpu_slot(tmp_path: Path) -> None:
    held = [slots.try_acquire(2, tmp_path) for _ in range(2)]
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    start = time.monotonic()
    try:
        with pytest.raises(RunCancelled):
            slots.acquire(time.monotonic() + 60, 2, tmp_path, poll_s=0.05, cancel=cancel)
    finally:
        for s in held:
            assert s is not None
            s.release()
    assert time.monotonic() - start < 5


class Sink:
    def write(self, data: bytes) -> int:
        return len(data)

    def flush(self) -> None:
        pass


def test_a_job_starts_when_the_host_says_its_vm_started_not_when_a_log_line_reads_so(tmp_path: Path) -> None:
    """The host's on_start (a second boot included) makes the one "started" event; the progress text
    the run logs is only logged."""
    from provision.api.jobs import JobSpec, Runner
    from provision.hosts import RunIO, RunRequest, RunResult

    seen: list[RunRequest] = []

    class Host:
        name = "linux"

        def run(self, req: RunRequest, io: RunIO) -> RunResult:
            seen.append(req)
            assert io.say is not None and io.on_start is not None and io.out is not None
            io.say("qemu pid=999 accel=tcg")  # a log line, not a start
            io.on_start(4242, tmp_path)
            io.on_start(4343, tmp_path)  # booted once more: still one start
            io.out.write(b"hello\n")
            return RunResult(0, tmp_path, 4343, 0.5, "tcg")

    events: list[dict[str, object]] = []
    logged: list[str] = []
    runner = Runner(1, 1024, log=logged.append, host=Host())  # type: ignore[arg-type]
    job = runner.submit(JobSpec(catalog.load().get("cpu"), False, "echo hello", 60.0), events.append)
    assert job.done.wait(30)
    started = [e for e in events if e["event"] == "started"]
    assert [e["qemu_pid"] for e in started] == [4242]
    assert any("qemu pid=999" in line for line in logged)
    (req,) = seen
    assert req.command[:2] == ("sh", "-c") and req.command[-1] == "echo hello" and req.timeout_s <= 60.0
    final = events[-1]
    assert final["event"] == "exit" and final["stdout"] == "hello\n" and final["qemu_pid"] == 4343
