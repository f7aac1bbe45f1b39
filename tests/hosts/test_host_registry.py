"""One Host protocol and one registry: both hosts implement every operation, the CLI asks
`hosts.native()`, and a plan is data before anything runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from provision import hosts
from provision.core import catalog, errors

OPERATIONS = ("plan_run", "run", "plan_serve", "serve_guest", "plan_shell", "shell", "doctor_checks", "bench",
              "perplexity", "prepare", "route_facts", "gpu_slots")
CLI = Path(hosts.__file__).resolve().parents[1] / "cli"


@pytest.mark.parametrize("key", sorted(hosts.HOSTS))
def test_every_host_implements_every_operation(key: str) -> None:
    host = hosts.get(key)
    assert isinstance(host, hosts.Host) and host.name == key
    assert all(callable(getattr(host, op)) for op in OPERATIONS)


def test_an_unknown_platform_is_e033() -> None:
    with pytest.raises(errors.WrongPlatform):
        hosts.native("win32")
    assert hosts.platform_key("linux") == "linux" and hosts.platform_key("darwin") == "darwin"


def test_the_cli_never_reads_the_platform() -> None:
    # the one place that reads sys.platform is provision/hosts/__init__.py
    for path in CLI.glob("*.py"):
        tree = ast.parse(path.read_text())
        reads = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "platform"
                 and isinstance(n.value, ast.Name) and n.value.id == "sys"]  # fmt: skip
        assert reads == [], path.name


def test_a_linux_run_plan_is_data_and_refuses_a_gpu_on_a_cpu_stack_first() -> None:
    cat = catalog.load()
    host = hosts.get("linux")
    req = hosts.RunRequest(cat.get("llama-linux"), True, ("vulkaninfo", "--summary"), model_name="tiny.gguf")
    plan = host.plan_run(req)
    assert plan["route"] == "venus" and plan["gpu"] is True and plan["accel"] in ("kvm", "tcg")
    assert "vulkaninfo --summary" in str(plan["job"]) and plan["limits"]["timeout_s"] == req.limits.timeout_s
    with pytest.raises(errors.GpuNotSupported):
        host.plan_run(hosts.RunRequest(cat.get("cpu"), True, ("true",)))


def test_each_host_prepares_its_own_kind_and_names_the_other_wrong_platform() -> None:
    linux, darwin = hosts.get("linux"), hosts.get("darwin")
    with pytest.raises(errors.WrongPlatform, match="host-tools"):
        darwin.prepare(hosts.ToolsRequest(check=True))
    with pytest.raises(errors.WrongPlatform, match="provision launch"):
        linux.prepare(hosts.LaunchRequest())
    # the macOS plan is made anywhere: `provision launch --dry-run` reviews it before it runs on the Mac
    with pytest.raises(errors.ProvisionError) as info:
        darwin.prepare(hosts.LaunchRequest(krun=Path("/nonexistent-krun")), dry_run=True)
    assert info.value.code != "E033"  # it looked for the bundle: not refused for the platform


def test_a_run_request_checks_itself_where_it_is_made() -> None:
    cat = catalog.load()
    with pytest.raises(errors.GpuNotSupported):
        hosts.RunRequest(cat.get("cpu"), True, ("true",))
    with pytest.raises(errors.UnknownRoute):
        hosts.RunRequest(cat.get("llama-linux"), True, ("true",), route="apir")
    with pytest.raises(errors.InvalidValue):
        hosts.RunRequest(cat.get("cpu"), False, ("true",), timeout_s=-1)
    with pytest.raises(errors.InvalidValue):
        hosts.RunRequest(cat.get("cpu"), False, ("true",), forward=hosts.Forward("127.0.0.1", 70000, 8080))
    ok = hosts.RunRequest(cat.get("cpu"), False, ("true",), slot_wait_s=5.0)
    assert ok.deadline_s == ok.limits.timeout_s and ok.slot_wait_s == 5.0
