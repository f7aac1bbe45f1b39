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


def test_q_prints_nothing_but_errors_and_the_route_line_is_a_log_line(tmp_path, monkeypatch, capsys):
    # The host's real caches (host tools, images) plan the run; only the logs go to a fresh state dir.
    monkeypatch.setenv("PROVISION_STATE", str(tmp_path / "state"))
    argv = ["run", "--route", "cpu", "--dry-run", "--", "true"]
    assert cli.main(argv) == 0
    plain = capsys.readouterr()
    assert "provision: route: cpu" in plain.err and "exec true" in plain.out  # what -q must take away
    assert cli.main(["-q", *argv]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out == plain.out  # the plan is the result: it stays
    log = sorted((tmp_path / "state" / "logs").glob("*-run.log"))[-1].read_text()
    assert "provision: route: cpu" in log  # hidden from the terminal, kept in the log file
    assert cli.main(["-q", "run", "--route", "no-such-route", "--dry-run", "--", "true"]) != 0
    assert capsys.readouterr().err.startswith("E0")  # errors still show under -q


def test_a_child_gets_the_commands_file_and_flag_settings_while_os_environ_stays(sandbox, monkeypatch):
    import os

    from provision.core import settings

    monkeypatch.delenv("PROVISION_GPU_SLOTS", raising=False)
    echo = ["sh", "-c", 'printf "%s" "$PROVISION_GPU_SLOTS"']
    with settings.installed(settings.load(flags=["gpu_slots=7"])):
        assert runner.run(echo).out == "7"  # the command's --set, as the variable it stands for
        assert runner.run(echo, env={"PATH": os.environ["PATH"]}).out == "7"  # also under an env of its own
        child = runner.start(echo, "echo", stdout=runner.PIPE)
        with child:
            assert child.stdout is not None and child.stdout.read() == b"7"
        assert "PROVISION_GPU_SLOTS" not in os.environ
    assert runner.run(echo).out == ""  # the command is over: nothing was left behind
    handed = settings.load(flags=["gpu_slots=5"])
    assert runner.run(echo, settings=handed).out == "5"  # settings handed down beat a lookup


def test_main_does_not_write_os_environ_while_the_command_runs(sandbox, capsys, monkeypatch):
    import os

    from provision.cli import output

    monkeypatch.delenv("PROVISION_GPU_SLOTS", raising=False)
    seen: list[str | None] = []
    real_emit = output.emit

    def emit(*args, **kw):  # the handler has run; the command's settings are still installed
        seen.append(os.environ.get("PROVISION_GPU_SLOTS"))
        return real_emit(*args, **kw)

    monkeypatch.setattr(output, "emit", emit)
    assert cli.main(["--set", "gpu_slots=7", "config", "show", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["data"]["settings"]}
    assert rows["gpu_slots"]["value"] == "7" and seen == [None]
