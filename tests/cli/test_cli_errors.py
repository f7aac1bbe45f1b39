"""How every command fails: a code and a fix line always, JSON on request, and a bug is a report, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.core import catalog, errors
from provision.hosts.darwin.launch import LaunchPlan, Step


def test_every_error_class_has_its_own_fix_and_render_always_prints_it():
    for cls in errors.all_errors():
        assert cls.default_fix and cls.default_fix != errors.ProvisionError.default_fix, cls.code
        rendered = cls("something went wrong").render().splitlines()
        assert rendered[0] == f"{cls.code}: something went wrong" and rendered[1].startswith("  fix: ")
    assert errors.InvalidValue("x", fix="do this").render().endswith("fix: do this")


def test_argument_errors_are_e003_with_a_fix_and_json_when_asked(capsys):
    assert cli.main(["model", "pull", "--json"]) == errors.InvalidValue.exit_status
    out, err = capsys.readouterr()
    assert json.loads(out) == {
        "command": "model pull",
        "status": "error",
        "data": None,
        "error": errors.InvalidValue(
            "provision model pull: the following arguments are required: REF",
            fix="see `provision model pull --help` for what it takes",
        ).as_dict(),
    }
    assert err.startswith("E003: provision model pull: the following arguments are required")
    assert "\n  fix: see `provision model pull --help`" in err


def test_a_bug_prints_a_short_report_and_exits_70_with_the_traceback_in_a_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom in the catalog")

    monkeypatch.setattr(catalog, "load", broken)
    assert cli.main(["stacks", "--json"]) == errors.INTERNAL_ERROR_STATUS == 70
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert err.startswith("internal error: RuntimeError: boom in the catalog")
    report = Path(err.split("details: ", 1)[1].split("\n", 1)[0])
    assert report.parent == tmp_path / "cache" / "crash"
    assert "Traceback" in report.read_text() and "boom in the catalog" in report.read_text()
    assert json.loads(out) == {
        "command": "stacks",
        "status": "error",
        "data": None,
        "error": {
            "code": "internal",
            "message": "internal error: RuntimeError: boom in the catalog",
            "fix": "report it with that file",
            "details": str(report),
            "exit_status": 70,
        },
    }


def test_a_real_process_gets_the_same_codes(tmp_path):
    env = {**os.environ, "PROVISION_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "provision", "launch", "--dry-run", "--machine", "m\necho INJECTED"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == errors.InvalidValue.exit_status and done.stdout == ""
    assert done.stderr.startswith("E003: --machine 'm\\necho INJECTED'") and "\n  fix: " in done.stderr


def test_a_launch_plan_keeps_every_line_break_inside_its_comments():
    plan = LaunchPlan(
        route="venus",
        machine="m",
        env={"A": "x\ny"},
        unset=(),
        steps=(Step(("podman", "machine", "start", "m"), "why\necho INJECTED"),),
        verify=Step(("lsof",), "check"),
        expect_virglrenderer="/x",
        warnings=("line one\nrm -rf /",),
    )
    lines = plan.shell().splitlines()
    assert all(line.startswith(("#", "export ", "unset ")) or line == "y'" for line in lines), lines
    assert "export A='x" in plan.shell()  # a value with a line break stays inside its quotes


@pytest.mark.parametrize(("where", "why"), [("file", "not a directory"), ("file/cache", "Not a directory")])
def test_a_cache_that_cannot_be_a_directory_is_e003_naming_the_variable(tmp_path, monkeypatch, capsys, where, why):
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / where))
    assert cli.main(["model", "list"]) == errors.InvalidValue.exit_status
    err = capsys.readouterr().err
    assert f"E003: cache directory {tmp_path / where} (PROVISION_CACHE=" in err and why in err
    assert "\n  fix: set PROVISION_CACHE to a writable directory" in err
    assert (tmp_path / "file").read_text() == "x"
