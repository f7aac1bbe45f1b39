"""execute boots a guest once more when its init never started, and only a second hang is E024.

The boot is the real watch loop over a real process standing in for QEMU (nothing on the console
for the first, the init's lines for the second): what cannot be made here on purpose is the rare
TCG hang itself, so the stand-in is silent where QEMU was.
"""

from __future__ import annotations

import io
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from provision.core.errors import VmFailed
from provision.hosts import RunIO, RunResult
from provision.hosts.linux.run import execute, run_dirs, watch

BOOTED = "printf 'KRUN-INIT up=1\\nKRUN-EXIT=7\\n' > console.log; sleep 600"


def _fake_boot(run_dir: Path, scripts: list[str], pids: list[int]):
    """A boot as _boot does it, QEMU replaced by ``sh -c`` of the next script; the real watch decides."""

    def boot(plan, deadline, io, **_kw):
        (run_dir / "qemu.log").write_text(f"boot {len(pids) + 1}\n")
        proc = subprocess.Popen(["sh", "-c", scripts.pop(0)], cwd=run_dir, start_new_session=True)
        pids.append(proc.pid)
        try:
            status = watch.watch(proc, run_dir, deadline, io.out, io.err, boot_s=1.0)
            return RunResult(status, run_dir, proc.pid, 0.0, "tcg")
        finally:
            proc.kill()
            proc.wait()
            run_dirs.finished(run_dir)

    return boot


def _plan(run_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(run_dir=run_dir, job="echo job\n", timeout_s=60, slot_wait_s=None, gpu=False)


def test_a_boot_whose_init_never_started_is_booted_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pids: list[int] = []
    monkeypatch.setattr(execute, "_boot", _fake_boot(run_dir, ["sleep 600", BOOTED], pids))
    said: list[str] = []
    start = time.monotonic()
    result = execute.execute(_plan(run_dir), RunIO(io.BytesIO(), io.BytesIO(), say=said.append))
    assert result.exit_status == 7 and result.pid == pids[1] and len(pids) == 2
    assert 1.0 <= time.monotonic() - start < 20
    (line,) = said
    assert "init never started" in line and "booting it once more" in line and str(run_dir / "boot-1") in line
    assert (run_dir / "boot-1" / "qemu.log").read_text() == "boot 1\n"  # the first boot's logs, kept
    assert (run_dir / "qemu.log").read_text() == "boot 2\n"
    assert b"KRUN-EXIT=7" in (run_dir / "console.log").read_bytes()


def test_a_second_hang_is_e024_naming_both_boots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    pids: list[int] = []
    monkeypatch.setattr(execute, "_boot", _fake_boot(run_dir, ["sleep 600", "sleep 600", BOOTED], pids))
    with pytest.raises(VmFailed) as info:
        execute.execute(_plan(run_dir), RunIO(io.BytesIO(), io.BytesIO(), say=lambda _line: None))
    assert info.value.code == "E024" and len(pids) == 2  # twice, not a third time
    assert "init never started" in info.value.message and str(run_dir / "boot-1") in info.value.message
    assert "provision doctor" in info.value.fix


def test_logs_that_cannot_be_set_aside_end_in_e024_not_a_second_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "boot-1").write_text("in the way\n")  # mkdir fails as it would on a full disk
    pids: list[int] = []
    monkeypatch.setattr(execute, "_boot", _fake_boot(run_dir, ["sleep 600", BOOTED], pids))
    with pytest.raises(VmFailed) as info:
        execute.execute(_plan(run_dir), RunIO(io.BytesIO(), io.BytesIO(), say=lambda _line: None))
    assert info.value.code == "E024" and len(pids) == 1  # no second boot over the first one's logs
    assert "could not be set aside" in info.value.message and "File exists" in info.value.message
    assert str(run_dir) in info.value.fix
    assert (run_dir / "qemu.log").read_text() == "boot 1\n"
