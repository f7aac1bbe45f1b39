"""The spine every command shares: one envelope, -v shows each program run, a log file per invocation."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.adapters import runner
from provision.core import errors, paths


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PROVISION_STATE", str(tmp_path / "state"))
    return tmp_path


def _not_a_library(tmp_path: Path) -> Path:
    lib = tmp_path / "libnot.so"
    lib.write_bytes(b"not an ELF file")
    return lib


def test_v_shows_each_program_run_and_the_default_does_not(sandbox, capsys):
    lib = _not_a_library(sandbox)
    argv = ["apir", "check", "--backend", str(lib), "--ggml-library", str(lib)]
    assert cli.main(argv) == errors.ApirCheckFailed.exit_status  # a probe child ran, and failed
    assert "+ " not in capsys.readouterr().err
    assert cli.main(["-v", *argv]) == errors.ApirCheckFailed.exit_status
    err = capsys.readouterr().err
    assert f"provision: + {sys.executable} -P -m provision.adapters.apir_child --child" in err
    assert cli.main([*argv, "-q"]) == errors.ApirCheckFailed.exit_status


def test_every_invocation_leaves_a_log_file_with_its_program_runs(sandbox, capsys):
    lib = _not_a_library(sandbox)
    cli.main(["apir", "check", "--backend", str(lib), "--ggml-library", str(lib)])
    logs = sorted((sandbox / "state" / "logs").glob("*-apir-check.log"))
    assert len(logs) == 1
    text = logs[0].read_text()
    assert "provision apir check --backend" in text and "+ " in text and "apir_child" in text


def test_success_failed_checks_and_errors_share_one_envelope(sandbox, capsys, monkeypatch):
    assert cli.main(["stacks", "--json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert set(ok) == {"command", "status", "data", "error"} and ok["status"] == "ok" and ok["error"] is None
    assert cli.main(["model", "path", "no-such-model", "--json"]) != 0
    bad = json.loads(capsys.readouterr().out)
    assert set(bad) == set(ok) and bad["status"] == "error" and bad["data"] is None
    assert bad["command"] == "model path" and bad["error"]["code"].startswith("E0")
    lib = _not_a_library(sandbox)
    assert cli.main(["apir", "check", "--backend", str(lib), "--ggml-library", str(lib), "--json"]) != 0
    both = json.loads(capsys.readouterr().out)  # a report that also failed: its data and its error
    assert both["status"] == "error" and both["data"]["result"]["stage"] and both["error"]["code"] == "E040"


def test_the_runner_names_a_missing_program_and_maps_failure_to_the_callers_code(caplog):
    with pytest.raises(errors.ToolMissing, match="no-such-program-xyz is not installed"):
        runner.run(["no-such-program-xyz"])
    with pytest.raises(errors.BuildFailed) as failed:
        runner.run(["sh", "-c", "echo one; echo two >&2; exit 3"], error=errors.BuildFailed, what="the step",
                   fix="see above", on_line=lambda _line: None)  # fmt: skip
    assert "the step exited 3:\none\ntwo" in failed.value.message and failed.value.fix == "see above"
    seen: list[str] = []
    done = runner.run(["sh", "-c", "for i in 1 2 3 4; do echo $i; done"], on_line=seen.append, tail=2)
    assert seen == ["1", "2", "3", "4"] and done.tail == ("3", "4") and done.ok
    with caplog.at_level(logging.INFO, logger="provision.run"):
        slow = runner.run(["sleep", "30"], timeout=0.5)
    assert slow.timed_out and slow.status == 124
    assert any(r.getMessage().startswith("+ ") and "sleep 30" in r.getMessage() for r in caplog.records)
    assert runner.probe(["no-such-program-xyz"]) is None
    assert runner.probe(["sh", "-c", "echo hi; exit 2"]) == (2, "hi\n")


def test_every_cache_directory_named_in_the_code_is_in_the_layout_table():
    import ast

    named = set()
    for path in Path(paths.__file__).resolve().parents[1].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            called = getattr(node, "func", None)
            if called is not None and getattr(called, "attr", getattr(called, "id", "")) == "cache_dir":
                assert isinstance(node, ast.Call)
                if node.args and isinstance(node.args[0], ast.Constant):
                    named.add(node.args[0].value)
    assert named and named <= set(paths.LAYOUT), named - set(paths.LAYOUT)
    with pytest.raises(AssertionError, match="not in provision/core/paths.py LAYOUT"):
        paths.cache_dir("somewhere-new")
