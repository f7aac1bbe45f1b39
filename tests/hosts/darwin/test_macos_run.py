"""`provision run` on the podman machine as data (any OS), the host-backend choice, and the
podman machine JSON shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provision import cli, hosts
from provision.adapters import podman_machine as pm
from provision.core import catalog, errors, pins
from provision.hosts.darwin.runplan import image_repo, plan_run

COMPAT = pins.load().compat
CAT = catalog.load()
IMG = "localhost/krun-gpu/llama:0123456789ab"


def test_gpu_run_gets_dri_and_a_read_only_model():
    plan = plan_run(
        CAT.get("llama"),
        gpu=True,
        route=None,
        model_path=Path("/Users/me/models/q.gguf"),
        command=["llama-bench", "-m", "/models/q.gguf"],
        compat=COMPAT,
        image=IMG,
    )
    argv = list(plan.argv)
    assert argv[:3] == ["podman", "run", "--rm"]
    assert argv[argv.index("--device") + 1] == "/dev/dri"
    assert argv[argv.index("-v") + 1] == "/Users/me/models/q.gguf:/models/q.gguf:ro"
    assert "PROVISION_MODEL=/models/q.gguf" in argv
    assert argv[-4:] == [IMG, "llama-bench", "-m", "/models/q.gguf"]
    assert plan.route == "venus"


def test_no_gpu_flag_means_no_device_and_gpu_on_cpu_stack_is_e007():
    plan = plan_run(
        CAT.get("llama"), gpu=False, route=None, model_path=None, command=["true"], compat=COMPAT, image=IMG
    )
    assert "--device" not in plan.argv
    with pytest.raises(errors.GpuNotSupported):
        plan_run(CAT.get("cpu"), gpu=True, route=None, model_path=None, command=["true"], compat=COMPAT, image=IMG)
    with pytest.raises(errors.UnknownRoute):
        plan_run(CAT.get("llama"), gpu=True, route="apir", model_path=None, command=["true"], compat=COMPAT, image=IMG)
    with pytest.raises(errors.InvalidValue):
        plan_run(
            CAT.get("llama"), gpu=True, route=None, model_path=Path("rel.gguf"), command=["x"], compat=COMPAT, image=IMG
        )


def test_apir_capset_env_only_when_the_hypervisor_routes_it():
    stack = CAT.get("llama-apir")
    plan = plan_run(stack, gpu=True, route="apir", model_path=None, command=["llama-bench"], compat=COMPAT, image=IMG)
    assert "GGML_DISABLE_VULKAN=1" in plan.argv
    assert not any(a.startswith("GGML_REMOTING_USE_APIR_CAPSET") for a in plan.argv)
    assert COMPAT["libkrun_routes_apir_capset"] is False
    future = {**COMPAT, "libkrun_routes_apir_capset": True}
    plan = plan_run(stack, gpu=True, route="apir", model_path=None, command=["x"], compat=future, image=IMG)
    assert "GGML_REMOTING_USE_APIR_CAPSET=1" in plan.argv
    assert image_repo(stack) == "localhost/krun-gpu/llama-apir"


def test_run_cli_refuses_gpu_on_cpu_stack_before_anything(capsys):
    assert cli.main(["run", "cpu", "--gpu", "--", "true"]) == errors.GpuNotSupported.exit_status
    assert "E007" in capsys.readouterr().err


def test_native_host_by_platform():
    from provision.hosts.darwin.host import DarwinHost
    from provision.hosts.linux.host import LinuxHost

    h = hosts.native("darwin")
    assert isinstance(h, DarwinHost) and isinstance(h, hosts.Host) and h.name == "darwin"
    assert isinstance(hosts.native("linux"), LinuxHost) and isinstance(hosts.native("linux"), hosts.Host)
    with pytest.raises(errors.WrongPlatform):
        hosts.native("win32")


def test_bench_on_a_mac_is_wrong_platform_before_any_guest(tmp_path, monkeypatch, capsys):
    # `provision bench` runs QEMU guests: on the darwin host it is E033, not a Linux error (E020/E024).
    monkeypatch.setattr(hosts.sys, "platform", "darwin")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    code = cli.main(["bench", "llama-linux", "--model", str(model), "--out", str(tmp_path / "out"), "--json"])
    out, err = capsys.readouterr()
    assert code == errors.WrongPlatform.exit_status and err.startswith("E033: provision bench")
    assert json.loads(out)["error"]["code"] == "E033" and json.loads(out)["command"] == "bench run"
    assert not (tmp_path / "out").exists()


def test_podman_machine_commands_and_json_shapes():
    assert pm.init_cmd("m", cpus=4, memory_mib=8192) == [
        "podman",
        "machine",
        "init",
        "--cpus",
        "4",
        "--memory",
        "8192",
        "m",
    ]
    assert pm.start_cmd("m") == ["podman", "machine", "start", "m"]
    # `podman machine list --format json` (ListReporter: Memory is a byte count as a string)
    listed = pm.parse_list(
        json.dumps(
            [
                {
                    "Name": "podman-machine-default*",
                    "Default": True,
                    "Created": "2026-11-20T10:00:00Z",
                    "Running": True,
                    "Starting": False,
                    "LastUp": "Currently running",
                    "Stream": "",
                    "VMType": "libkrun",
                    "CPUs": 5,
                    "Memory": "8589934592",
                    "Swap": "0",
                    "DiskSize": "107374182400",
                    "Port": 52301,
                    "RemoteUsername": "core",
                    "IdentityPath": "/Users/me/.local/share/containers/podman/machine/machine",
                    "UserModeNetworking": True,
                }
            ]
        )
    )
    assert listed == [pm.MachineInfo("podman-machine-default", True, "libkrun", 5, 8192, True)]
    # `podman machine inspect` (InspectInfo: Resources.Memory in MiB, State as text)
    inspected = pm.parse_inspect(
        json.dumps(
            [
                {
                    "ConfigDir": {"Path": "/Users/me/.config/containers/podman/machine/libkrun"},
                    "ConnectionInfo": {
                        "PodmanSocket": {"Path": "/var/folders/x/T/podman/podman-machine-default-api.sock"},
                        "PodmanPipe": None,
                    },
                    "Created": "2026-11-20T10:00:00Z",
                    "LastUp": "2026-11-29T09:00:00Z",
                    "Name": "podman-machine-default",
                    "Resources": {"CPUs": 5, "DiskSize": 100, "Memory": 8192, "USBs": []},
                    "SSHConfig": {
                        "IdentityPath": "/Users/me/.local/share/containers/podman/machine/machine",
                        "Port": 52301,
                        "RemoteUsername": "core",
                    },
                    "State": "stopped",
                    "UserModeNetworking": True,
                    "Rootful": False,
                    "Rosetta": False,
                }
            ]
        )
    )
    assert inspected == [pm.MachineInfo("podman-machine-default", False, None, 5, 8192)]
    assert pm.find(inspected, "other") is None
    with pytest.raises(errors.MachineFailed):
        pm.parse_inspect('{"Name": "x"}')


def test_route_is_recorded_atomically(tmp_path, monkeypatch):
    from provision.hosts.darwin import machine_state

    monkeypatch.setenv("PROVISION_STATE", str(tmp_path))
    assert machine_state.recorded_route("m") is None
    path = machine_state.record_route("m", "apir", virglrenderer="/nix/store/x/lib/libvirglrenderer.1.dylib")
    assert machine_state.recorded_route("m") == "apir" and path.parent == tmp_path / "machines"
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]
    path.write_text("{not json")
    assert machine_state.recorded_route("m") is None
    assert os.environ["PROVISION_STATE"] == str(tmp_path)


def test_darwin_backend_checks_gpu_then_route_then_image(tmp_path, monkeypatch):
    from provision.hosts import RunRequest
    from provision.hosts.darwin.backend import DarwinBackend
    from provision.hosts.darwin.machine_state import record_route

    monkeypatch.setenv("PROVISION_STATE", str(tmp_path))
    b = DarwinBackend()
    with pytest.raises(errors.GpuNotSupported):
        b.run(RunRequest(CAT.get("cpu"), True, ("true",)))
    with pytest.raises(errors.UnknownRoute) as exc:
        b.run(RunRequest(CAT.get("llama"), True, ("true",)))
    assert "provision launch --route venus" in (exc.value.fix or "")
    record_route("podman-machine-default", "apir", virglrenderer=None)
    with pytest.raises(errors.UnknownRoute):
        b.run(RunRequest(CAT.get("llama"), True, ("true",)))  # APIR routing would hide Venus
    record_route("podman-machine-default", "venus", virglrenderer=None)
    # Route fits; the image comes from real `podman images`: a stack name nothing ever built.
    import dataclasses

    never_built = dataclasses.replace(CAT.get("llama"), name="krun-gpu-test-never-built")
    with pytest.raises(errors.ImageBuildFailed) as exc:
        b.run(RunRequest(never_built, True, ("true",)))
    assert exc.value.fix == "provision image build krun-gpu-test-never-built"
