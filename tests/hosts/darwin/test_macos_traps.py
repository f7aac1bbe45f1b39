"""The Mac traps: each recorded case (tests/data/macos/traps/cases.json) makes its doctor line fail
and name the fix; the healthy baseline passes every trap. Driven through ``trap_checks`` with the
real containers.conf/PATH lookup of krunkit (a real executable in a temporary PATH) and a runner
that answers podman, krunkit and the guest with the recorded outputs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from provision.core import pins
from provision.core.diagnostics import Check, DoctorContext
from provision.doctor import checks as doctor
from provision.hosts.darwin import machine_state, traps

DATA = Path(__file__).resolve().parents[2] / "data" / "macos" / "traps"
CASES = json.loads((DATA / "cases.json").read_text())


def recorded(name: str | None) -> str | None:
    return None if name is None else (DATA / name).read_text()


def run_case(inputs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Check]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if inputs["krunkit"] is not None:
        krunkit = bin_dir / "krunkit"
        krunkit.write_text("#!/bin/sh\nexit 0\n")
        krunkit.chmod(0o755)
    monkeypatch.setenv("PROVISION_STATE", str(tmp_path / "state"))
    machine_state.record_route("podman-machine-default", inputs["route"], virglrenderer=None)
    env = {"PATH": str(bin_dir), "CONTAINERS_CONF": str(tmp_path / "none.conf")}
    env.update(json.loads(recorded(inputs["env"]) or "{}"))
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> tuple[int, str] | None:
        calls.append(list(argv))
        tail = list(argv[1:])
        if Path(argv[0]).name == "krunkit" and tail == ["--version"]:
            return 0, recorded(inputs["krunkit"]) or ""
        answers = {
            ("--version",): recorded(inputs["podman"]),
            ("machine", "inspect", "podman-machine-default"): recorded(inputs["inspect"]),
            ("machine", "ssh", "podman-machine-default", "uname", "-r"): recorded(inputs["uname"]),
        }
        if tail[:1] == ["run"] and tail[-2:] == ["vulkaninfo", "--summary"]:
            return 0, recorded(inputs["vulkaninfo"]) or ""
        out = answers.get(tuple(tail))
        return None if out is None else (0, out)

    ctx = DoctorContext(
        platform="darwin", env=env, home=tmp_path, compat=pins.default().compat, guest_image="localhost/llama:test",
        extras={"model_mib": inputs["model_mib"], "host_ram_mib": inputs["host_ram_mib"]},
    )  # fmt: skip
    found = traps.trap_checks(ctx, run)
    # every probe ran: the guest kernel and Vulkan listings were really asked for
    assert any(c[-2:] == ["uname", "-r"] for c in calls) and any(c[-1] == "--summary" for c in calls)
    return found


def by_id(found: list[Check]) -> dict[str, Check]:
    return {c.id: c for c in found}


def test_the_healthy_baseline_passes_every_trap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = by_id(run_case(CASES["baseline"], tmp_path, monkeypatch))
    assert set(found) == {"trap.provider", "trap.krunkit", "trap.gpu-window", "trap.guest-vulkan",
                          "trap.guest-kernel", "trap.apir-env"}  # fmt: skip
    assert {c.status for c in found.values()} == {"ok"}, found


@pytest.mark.parametrize("case", sorted(CASES["cases"]))
def test_each_trap_has_a_recorded_case_whose_doctor_line_names_the_fix(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = CASES["cases"][case]
    found = by_id(run_case({**CASES["baseline"], **spec["swap"]}, tmp_path, monkeypatch))
    line = found[spec["check"]]
    assert line.status == "fail", line
    assert line.fix and spec["fix_has"] in line.fix, line
    # only this trap fires: the case isolates one cause
    others = [c for c in found.values() if c.id != spec["check"] and c.status != "ok"]
    assert others == [], others


def test_every_trap_has_a_case() -> None:
    assert {c["check"] for c in CASES["cases"].values()} == {
        "trap.provider", "trap.krunkit", "trap.gpu-window", "trap.guest-vulkan", "trap.guest-kernel", "trap.apir-env"
    }  # fmt: skip


def test_the_gpu_window_is_krunkits_formula() -> None:
    limits = pins.default().compat["krunkit_memory"]
    # krunkit 1.3.1 src/context.rs: rounded = (RAM / 1024 + 1) * 1024; VRAM = min(63488 - rounded, host RAM)
    assert traps.vram_window_mib(8192, None, limits) == 63488 - 9216
    assert traps.vram_window_mib(8191, None, limits) == 63488 - 8192
    assert traps.vram_window_mib(8192, 16384, limits) == 16384
    assert traps.vram_window_mib(54272, None, limits) == 8192  # the fix the 56 GiB case names fits 8 GiB


def test_ram_over_krunkits_cap_is_its_own_failure() -> None:
    inspect = recorded("podman-machine-inspect-libkrun.json") or ""
    big = inspect.replace('"Memory": 8192', '"Memory": 65536')
    facts = traps.MacFacts(machine="podman-machine-default", inspect=big)
    c = by_id(traps.checks(facts, pins.default().compat))["trap.gpu-window"]
    assert c.status == "fail" and c.fix and "--memory 61440" in c.fix


def test_the_darwin_doctor_runs_the_traps() -> None:
    ctx = doctor.context(platform="darwin", env={})
    ids = {c.id for c in doctor.run(ctx)}
    assert {c.id for c in traps.trap_checks(ctx)} <= ids
