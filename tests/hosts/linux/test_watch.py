"""The run's watch loop (hosts/linux/run/watch.py) over real growing files and a real process."""

from __future__ import annotations

import io
import json
import subprocess
import threading
import time
from pathlib import Path

import pytest

from provision.core.errors import GuestAborted, RunTimeout
from provision.hosts.linux.run import logs, watch


@pytest.fixture
def qemu():
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _later(delay: float, fn) -> threading.Timer:
    t = threading.Timer(delay, fn)
    t.start()
    return t


def test_a_host_assert_in_qemu_log_after_guest_stderr_is_classified_at_once(tmp_path: Path, qemu) -> None:
    # The guest wrote five lines to stderr, QEMU one to its log; then the host ggml aborts. One
    # line counter over both files put the new QEMU line below the counter: never classified.
    (tmp_path / "qemu.log").write_text("qemu-system-x86_64: warning: host doesn't support requested feature\n")
    (tmp_path / "stderr.log").write_text("".join(f"llama: load step {i}\n" for i in range(5)))
    assertion = "/src/ggml/src/ggml-vulkan/ggml-vulkan.cpp:5120: GGML_ASSERT(ggml_vk_dim01_contiguous(src0)) failed\n"
    appended: list[float] = []

    def host_abort() -> None:
        with (tmp_path / "qemu.log").open("a") as f:
            f.write(assertion)
        appended.append(time.monotonic())

    _later(0.6, host_abort)
    err = io.BytesIO()
    with pytest.raises(GuestAborted) as info:
        watch.watch(qemu, tmp_path, time.monotonic() + 30, io.BytesIO(), err, watch_workers=True)
    assert appended and time.monotonic() - appended[0] < 2.0
    assert info.value.code == "E023" and "GGML_ASSERT" in info.value.message
    assert err.getvalue().count(b"load step") == 5  # the guest's stderr reached the caller once
    assert qemu.poll() is not None  # QEMU was stopped
    record = json.loads((tmp_path / "workers.json").read_text())  # the watch's record, written whole
    assert record["workers_seen"] == 0 and record["contexts"] == 0 and record["blind"] is False


def test_a_guest_abort_on_stderr_is_classified_too(tmp_path: Path, qemu) -> None:
    (tmp_path / "qemu.log").write_text("".join(f"qemu line {i}\n" for i in range(8)))
    _later(0.4, lambda: (tmp_path / "stderr.log").write_text("ggml_vulkan: Error: Missing op: ADD\n"))
    with pytest.raises(GuestAborted) as info:
        watch.watch(qemu, tmp_path, time.monotonic() + 30, io.BytesIO(), io.BytesIO(), watch_workers=True)
    assert "ggml-missing-op" in info.value.message


def test_a_fatal_line_written_in_two_pieces_is_seen_once_whole(tmp_path: Path) -> None:
    log = tmp_path / "qemu.log"
    lines = logs.Lines(log)
    log.write_bytes(b"ok\nGGML_AS")
    assert lines.read() == ["ok"]
    with log.open("ab") as f:
        f.write(b"SERT(x) failed\nnext")
    assert lines.read() == ["GGML_ASSERT(x) failed"]


def test_only_the_appended_bytes_are_read(tmp_path: Path) -> None:
    # A serve runs for days: each look reads what was appended, never the file again.
    log = tmp_path / "stderr.log"
    log.write_bytes(b"a" * 1_000_000 + b"\n")
    reader = logs.Appended(log)
    assert len(reader.read()) == 1_000_001
    with log.open("r+b") as f:  # change what was read already, then append
        f.write(b"CHANGED")
        f.seek(0, 2)
        f.write(b"new\n")
    assert reader.read() == b"new\n"
    assert reader.offset == 1_000_005
    assert reader.read() == b""


def test_the_exit_status_split_across_two_reads_is_read_whole(tmp_path: Path, qemu) -> None:
    console = tmp_path / "console.log"
    console.write_bytes(b"KRUN-INIT up=1\nKRUN-EXIT=1")
    _later(0.5, lambda: console.write_bytes(b"KRUN-INIT up=1\nKRUN-EXIT=12\n"))
    _later(0.7, qemu.kill)
    assert watch.watch(qemu, tmp_path, time.monotonic() + 30, io.BytesIO(), io.BytesIO()) == 12


def test_a_silent_guest_runs_to_its_deadline(tmp_path: Path, qemu) -> None:
    start = time.monotonic()
    with pytest.raises(RunTimeout):
        watch.watch(qemu, tmp_path, start + 1.5, io.BytesIO(), io.BytesIO(), watch_workers=True)
    assert 1.5 <= time.monotonic() - start < 6


def test_a_guest_whose_init_never_starts_is_stopped_at_the_boot_limit(tmp_path: Path, qemu) -> None:
    start = time.monotonic()
    with pytest.raises(watch.InitNeverStarted) as info:  # execute boots once more (test_boot_retry.py)
        watch.watch(qemu, tmp_path, start + 60, io.BytesIO(), io.BytesIO(), boot_s=1.0)
    assert 1.0 <= time.monotonic() - start < 8 and "init never started" in str(info.value)
    assert qemu.poll() is not None  # QEMU was stopped


def test_a_guest_that_booted_may_stay_silent_past_the_boot_limit(tmp_path: Path, qemu) -> None:
    (tmp_path / "console.log").write_bytes(b"KRUN-INIT up=9.1\n")
    console = tmp_path / "console.log"
    _later(2.0, lambda: console.write_bytes(b"KRUN-INIT up=9.1\nKRUN-EXIT=0\n"))
    _later(2.2, qemu.kill)
    assert watch.watch(qemu, tmp_path, time.monotonic() + 30, io.BytesIO(), io.BytesIO(), boot_s=0.5) == 0
