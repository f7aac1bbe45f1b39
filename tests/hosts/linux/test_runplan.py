"""A Linux run as a plan: plan_run is pure and frozen, `provision run --dry-run` prints it and starts nothing."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from provision.adapters import qemu
from provision.core import catalog, isolation
from provision.hosts import RunRequest
from provision.hosts.linux.run import runplan
from provision.hosts.linux.tools import host_tools
from provision.images.disks import RootDisk
from tests.helpers import run_provision
from tests.hosts.linux.test_doctor_linux import _bundle_install


def _facts(tmp_path: Path, tools: host_tools.HostTools, **kw: object) -> runplan.HostFacts:
    root = RootDisk(tmp_path / "vm/root.img", tmp_path / "vm/vmlinuz", tmp_path / "vm/initrd.img", "sha256:x")
    return runplan.HostFacts(tools, "tcg", render_node=False, root=root, run_dir=tmp_path / "run", **kw)  # type: ignore[arg-type]


def test_the_same_request_and_facts_give_the_same_frozen_plan(tmp_path: Path) -> None:
    stack = catalog.load().get("llama-linux")
    req = RunRequest(stack, True, ("vulkaninfo", "--summary"), isolation.GuestLimits(memory_mib=3000), timeout_s=60.0)
    tools = host_tools.HostTools(tmp_path / "sid", "cache")
    one = runplan.plan_run(req, _facts(tmp_path, tools))
    assert one == runplan.plan_run(req, _facts(tmp_path, tools))
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.accel = "kvm"  # type: ignore[misc]
    argv = one.qemu_argv
    # Paths are as QEMU sees them inside the tools chroot; the binds say where they come from.
    assert dict(one.binds) == {tmp_path / "run": runplan.IN_CHROOT["run"], tmp_path / "vm": runplan.IN_CHROOT["vm"]}
    assert f"file={runplan.IN_CHROOT['vm']}/root.img" in " ".join(argv)
    assert argv[argv.index("-m") + 1] == "3000" and argv[argv.index("-smp") + 1] == str(runplan.CPUS)
    assert argv[argv.index("-sandbox") + 1] == isolation.SANDBOX_GPU and one.display == "sdl"
    assert one.job.splitlines()[-1] == "exec vulkaninfo --summary" and not one.watch_workers


def test_an_apir_plan_carries_its_qemu_environment_and_watches_workers(tmp_path: Path) -> None:
    stack = catalog.load().get("llama-apir-linux")
    req = RunRequest(stack, True, ("true",), timeout_s=60.0)
    env = {"VIRGL_ROUTE_VENUS_TO_APIR": "1", "LD_LIBRARY_PATH": "/opt/virgl-apir/lib"}
    plan = runplan.plan_run(req, _facts(tmp_path, host_tools.HostTools(Path("/"), "host"), route_env=env,
                                        watch_workers=True))
    assert dict(plan.env)["VIRGL_ROUTE_VENUS_TO_APIR"] == "1" and plan.watch_workers
    assert plan.binds == () and plan.root == Path("/") and plan.inherit_env and plan.user is None
    assert "export VIRGL_ROUTE_VENUS_TO_APIR=1" in plan.shell()
    cpu = runplan.plan_run(RunRequest(stack, False, ("true",), timeout_s=60.0), _facts(tmp_path, plan.tools))
    assert cpu.spec.display == "none" and qemu.argv(cpu.spec)[qemu.argv(cpu.spec).index("-sandbox") + 1] == (
        isolation.SANDBOX_FULL)


def test_run_dry_run_prints_the_plan_and_starts_nothing(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(host_tools.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    top = _bundle_install(empty_cache)
    before = sorted(p.relative_to(empty_cache) for p in empty_cache.rglob("*"))
    res = run_provision("run", "llama-linux", "--gpu", "--memory", "3072", "--dry-run", "--", "echo", "a b")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "# provision run llama-linux: route venus, accel tcg, display sdl"
    qemu_line = next(line for line in lines if line.split(" ", 1)[0].endswith(qemu.BINARY))
    argv = shlex.split(qemu_line)
    assert argv[0] == str(top / "usr/bin" / qemu.BINARY)  # the bundle's own QEMU, as it will be started
    assert argv[argv.index("-m") + 1] == "3072" and "-accel" in argv and "tcg,thread=multi" in argv
    assert "#   exec echo 'a b'" in lines
    assert str(top) in lines[1]
    # Nothing ran: no run directory, no job disk, no VM disk, no records of a child.
    after = sorted(p.relative_to(empty_cache) for p in empty_cache.rglob("*"))
    made = [p for p in after if p not in before]
    # (a version probe's empty per-process record folder under jobs/ may appear: no file may)
    assert [p for p in made if not (empty_cache / p).is_dir()] == []
