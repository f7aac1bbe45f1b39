"""The launch plan as data (any OS): env values, command order, route switch, memory refusals,
and --dry-run output that a real bash sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.adapters.podman_machine import MachineInfo
from provision.core import errors, pins
from provision.hosts.darwin.bundle import KrunBundle
from provision.hosts.darwin.launch import APIR_HOST_ENV, LaunchRequest, plan_launch
from tests.hosts.darwin.macos_fixtures import make_bundle

COMPAT = pins.load().compat
B = KrunBundle(Path("/Users/me/.nix-profile"))


def argvs(plan):
    return [list(s.argv) for s in plan.steps]


def test_venus_on_a_new_machine_inits_then_starts_with_libkrun_and_our_krunkit():
    plan = plan_launch(
        LaunchRequest(cpus=4, memory_mib=8192, vram_mib=4096), B, COMPAT, machine=None, recorded_route=None
    )
    assert plan.env == {
        "CONTAINERS_MACHINE_PROVIDER": "libkrun",
        "CONTAINERS_HELPER_BINARY_DIR": "/Users/me/.nix-profile/bin",
    }
    assert set(plan.unset) == set(APIR_HOST_ENV)  # krunkit inherits podman's env: no stale APIR routing
    assert argvs(plan) == [
        ["podman", "machine", "init", "--cpus", "4", "--memory", "8192", "podman-machine-default"],
        ["podman", "machine", "start", "podman-machine-default"],
    ]
    assert list(plan.verify.argv)[:1] == ["lsof"] and "krunkit" in plan.verify.argv
    assert plan.expect_virglrenderer == "/Users/me/.nix-profile/lib/libvirglrenderer.1.dylib"
    assert plan.warnings == ()


def test_apir_sets_the_backend_env_and_warns_that_venus_is_disabled():
    req = LaunchRequest(route="apir", machine="gpu", apir_log_dir="/tmp/logs")
    plan = plan_launch(req, B, COMPAT, machine=None, recorded_route=None)
    assert plan.env["VIRGL_APIR_BACKEND_LIBRARY"] == "/Users/me/.nix-profile/lib/libggml-virtgpu-backend.dylib"
    assert plan.env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == "/Users/me/.nix-profile/lib/libggml-metal.dylib"
    assert plan.env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_metal_reg"
    assert plan.env["VIRGL_ROUTE_VENUS_TO_APIR"] == "1"
    assert plan.env["VIRGL_APIR_LOG_TO_FILE"] == "/tmp/logs/virgl-apir.log"
    assert plan.env["APIR_LLAMA_CPP_LOG_TO_FILE"] == "/tmp/logs/apir-ggml.log"
    assert plan.env["CONTAINERS_MACHINE_PROVIDER"] == "libkrun"
    assert plan.unset == ()
    assert any("Venus is disabled on machine gpu" in w for w in plan.warnings)
    # Without a log dir, stale log variables from the shell are dropped instead.
    plain = plan_launch(LaunchRequest(route="apir"), B, COMPAT, machine=None, recorded_route=None)
    assert set(plain.unset) == {"VIRGL_APIR_LOG_TO_FILE", "APIR_LLAMA_CPP_LOG_TO_FILE"}


def test_route_switch_restarts_the_running_machine_in_order():
    running = MachineInfo("podman-machine-default", True, "libkrun", 4, 8192)
    plan = plan_launch(LaunchRequest(route="apir"), B, COMPAT, machine=running, recorded_route="venus")
    assert argvs(plan) == [
        ["podman", "machine", "stop", "podman-machine-default"],
        ["podman", "machine", "start", "podman-machine-default"],
    ]
    assert any("running with venus" in w for w in plan.warnings)
    same = plan_launch(LaunchRequest(route="venus"), B, COMPAT, machine=running, recorded_route="venus")
    assert argvs(same) == []
    unknown = plan_launch(LaunchRequest(route="venus"), B, COMPAT, machine=running, recorded_route=None)
    assert [a[2] for a in argvs(unknown)] == ["stop", "start"]  # not started by us: env unknown


def test_stopped_machine_is_resized_then_started_and_running_one_stopped_first():
    stopped = MachineInfo("m", False, "libkrun", 4, 8192)
    plan = plan_launch(LaunchRequest(machine="m", memory_mib=16384), B, COMPAT, machine=stopped, recorded_route="venus")
    assert argvs(plan) == [
        ["podman", "machine", "set", "--memory", "16384", "m"],
        ["podman", "machine", "start", "m"],
    ]
    running = MachineInfo("m", True, "libkrun", 4, 8192)
    plan = plan_launch(LaunchRequest(machine="m", cpus=6), B, COMPAT, machine=running, recorded_route="venus")
    assert [a[2] for a in argvs(plan)] == ["stop", "set", "start"]


def test_memory_over_krunkit_cap_is_refused_with_the_reason():
    with pytest.raises(errors.MemoryLimit) as exc:
        plan_launch(LaunchRequest(memory_mib=61441), B, COMPAT, machine=None, recorded_route=None)
    assert exc.value.code == "E031" and "61440" in exc.value.message
    plan_launch(LaunchRequest(memory_mib=61440), B, COMPAT, machine=None, recorded_route=None)  # the cap itself is fine


def test_ram_plus_vram_over_64_gib_is_refused_and_a_small_window_warns():
    with pytest.raises(errors.MemoryLimit) as exc:
        plan_launch(LaunchRequest(memory_mib=60000, vram_mib=8192), B, COMPAT, machine=None, recorded_route=None)
    assert "68192 MiB" in exc.value.message and "64 GiB" in exc.value.message
    plan = plan_launch(LaunchRequest(memory_mib=61440, vram_mib=4096), B, COMPAT, machine=None, recorded_route=None)
    assert any("2048 MiB VRAM window" in w for w in plan.warnings)
    # An existing machine's memory counts when --memory is not given.
    big = MachineInfo("m", False, "libkrun", 4, 61000)
    with pytest.raises(errors.MemoryLimit):
        plan_launch(LaunchRequest(machine="m", vram_mib=8192), B, COMPAT, machine=big, recorded_route=None)


def test_unknown_route_and_bad_numbers_fail_with_codes():
    with pytest.raises(errors.UnknownRoute):
        plan_launch(LaunchRequest(route="cpu"), B, COMPAT, machine=None, recorded_route=None)
    with pytest.raises(errors.InvalidValue):
        plan_launch(LaunchRequest(cpus=0), B, COMPAT, machine=None, recorded_route=None)


class Result:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def provision_cli(capsys, monkeypatch):
    """The CLI in-process (same main() the console script runs), with the given environment."""

    def call(args, env):
        for k in list(os.environ):
            monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        code = cli.main(args)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return call


@pytest.fixture
def bundle_with_space(tmp_path):
    return make_bundle(tmp_path / "krun bundle")


def test_dry_run_is_sourced_by_bash(bundle_with_space, tmp_path):
    env = {**os.environ, "VIRGL_ROUTE_VENUS_TO_APIR": "1", "PROVISION_STATE": str(tmp_path / "state")}
    script = (
        f'source <({sys.executable} -m provision launch --dry-run --krun "{bundle_with_space}" --route apir); '
        'printf "%s|%s|%s\\n" "$VIRGL_ROUTE_VENUS_TO_APIR" "$CONTAINERS_HELPER_BINARY_DIR" '
        '"$APIR_LLAMA_CPP_GGML_LIBRARY_REG"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == f"1|{bundle_with_space}/bin|ggml_backend_metal_reg"
    # The Venus plan drops the APIR routing a previous shell left behind.
    script = (
        f'source <({sys.executable} -m provision launch --dry-run --krun "{bundle_with_space}"); '
        'echo "[${VIRGL_ROUTE_VENUS_TO_APIR-unset}] $CONTAINERS_MACHINE_PROVIDER"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[unset] libkrun"


def test_dry_run_json_is_the_plan(bundle_with_space, tmp_path, provision_cli):
    _provision = provision_cli
    env = {**os.environ, "PROVISION_STATE": str(tmp_path / "state")}
    res = _provision(["launch", "--dry-run", "--json", "--krun", str(bundle_with_space), "--memory", "8192"], env)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)["data"]
    assert plan["route"] == "venus"
    assert [s["argv"][2] for s in plan["steps"]] == ["init", "start"]
    assert plan["env"]["CONTAINERS_HELPER_BINARY_DIR"] == f"{bundle_with_space}/bin"
    res2 = _provision(["launch", "--dry-run", "--json", "--krun", str(bundle_with_space), "--memory", "8192"], env)
    assert res2.stdout == res.stdout
    refused = _provision(["launch", "--dry-run", "--krun", str(bundle_with_space), "--memory", "70000"], env)
    assert refused.returncode == errors.MemoryLimit.exit_status and "E031" in refused.stderr


def test_missing_bundle_is_e030_naming_where_it_looked(tmp_path, provision_cli):
    _provision = provision_cli
    env = {**os.environ, "HOME": str(tmp_path), "USER": "nobody-here", "XDG_STATE_HOME": str(tmp_path / "st")}
    res = _provision(["launch", "--dry-run"], env)
    assert res.returncode == errors.KrunBundleMissing.exit_status
    assert "E030" in res.stderr and str(tmp_path / ".nix-profile") in res.stderr
    res = _provision(["launch", "--dry-run", "--krun", str(tmp_path)], env)
    assert res.returncode == errors.KrunBundleMissing.exit_status and "no bin/krunkit" in res.stderr


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_launch_for_real_off_macos_is_wrong_platform(bundle_with_space, provision_cli):
    _provision = provision_cli
    res = _provision(["launch", "--krun", str(bundle_with_space)], dict(os.environ))
    assert res.returncode == errors.WrongPlatform.exit_status and "E033" in res.stderr
