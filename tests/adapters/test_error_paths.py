"""Failure paths that used to end in exit 70 or a traceback: each ends in its E-code and a fix line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.adapters import podman, podman_machine
from provision.core import errors
from provision.hosts.darwin import backend as darwin

REPO = Path(__file__).resolve().parents[2]


def _provision(args: list[str], env: dict[str, str], module: str = "provision") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=REPO, env={**os.environ, **env},
        timeout=120,
    )


@pytest.mark.parametrize("printed", ["not json at all", '{"Name": "m"}', "[1, 2]", '[{"Name": "m"'])
def test_podman_machine_output_that_is_not_a_list_of_machines_is_e034(printed: str) -> None:
    for parse in (podman_machine.parse_inspect, podman_machine.parse_list):
        with pytest.raises(errors.MachineFailed) as info:
            parse(printed)
        assert info.value.code == "E034" and "did not print a JSON list" in info.value.message
        assert "podman machine" in info.value.fix


def test_the_darwin_backend_reading_a_broken_podman_machine_inspect_is_e034(tmp_path: Path) -> None:
    # A real program on PATH that prints what a broken podman might: observe_machine ran it unguarded.
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'Error: json: cannot unmarshal'\n")
    fake.chmod(0o755)
    with pytest.raises(errors.MachineFailed) as info:
        darwin.observe_machine("krun-gpu", {"PATH": str(tmp_path)})
    assert "cannot unmarshal" in info.value.message


@pytest.mark.podman
def test_exporting_an_image_podman_cannot_create_is_e005(tmp_path: Path) -> None:
    flags = podman.decide_flags(podman.probe_host())
    with pytest.raises(errors.ImageBuildFailed) as info:
        podman.export_rootfs("localhost/krun-gpu-test/no-such-image:never", tmp_path / "root", flags)
    assert info.value.code == "E005" and "podman create" in info.value.message
    assert "no-such-image" in info.value.fix
    assert not (tmp_path / "root").exists()


def _shadow(tmp_path: Path, module: str) -> Path:
    """A directory that makes ``module`` absent, as on an install without the `api` extra."""
    pkg = tmp_path / "shadow" / module
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{module}'\", name='{module}')\n")
    return pkg.parent


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn"])
def test_provision_api_without_the_api_extra_names_the_pip_install(tmp_path: Path, missing: str) -> None:
    shadow = _shadow(tmp_path, missing)
    res = _provision(["api", "--listen", "127.0.0.1:0"], {"PYTHONPATH": f"{shadow}:{REPO}"})
    assert res.returncode == errors.ToolMissing.exit_status, res.stderr
    assert "E006" in res.stderr and "fix: pip install 'krun-gpu[api]'" in res.stderr
    assert missing in res.stderr and "Traceback" not in res.stderr and "bug in provision" not in res.stderr


def _script(path: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / path), *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=120)  # fmt: skip


def test_the_loopback_check_script_shows_a_provision_error_not_a_traceback(tmp_path: Path) -> None:
    res = _script("checks/apir-loopback/run-ops", ["--no-build"], {"PROVISION_HOST_TOOLS": str(tmp_path)})
    assert res.returncode == errors.HostToolsMissing.exit_status
    assert res.stderr.startswith("E020: ") and "\n  fix: " in res.stderr and "Traceback" not in res.stderr


def test_the_macos_report_script_shows_a_provision_error_not_a_traceback(tmp_path: Path) -> None:
    res = _script("checks/macos-report", ["apir", "--bench", str(tmp_path / "missing.json")], {})
    assert res.returncode == errors.InvalidValue.exit_status
    assert res.stderr.startswith("E003: --bench ") and "fix: --bench FILE" in res.stderr
    assert "Traceback" not in res.stderr
