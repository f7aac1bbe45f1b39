"""The macOS `podman run` plan's isolation as data: no network unless serve publishes one port,
no capabilities, no new privileges, a read-only root, limits from flags, and what doctor reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.core import catalog, errors, isolation, pins
from provision.core.diagnostics import DoctorContext
from provision.hosts.darwin.doctor_isolation import isolation_checks
from provision.hosts.darwin.runplan import Publish, plan_run

COMPAT = pins.load().compat
IMG = "localhost/krun-gpu/llama:0123456789ab"


def _plan(**kw: object) -> list[str]:
    args: dict[str, object] = {
        "gpu": True,
        "route": None,
        "model_path": None,
        "command": ["llama-cli"],
        "compat": COMPAT,
        "image": IMG,
    }
    args.update(kw)
    return list(plan_run(catalog.load().get("llama"), **args).argv)  # type: ignore[arg-type]


def test_podman_run_is_locked_down_by_default() -> None:
    argv = _plan()
    for flag in (
        "--network=none",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--read-only",
        "--tmpfs=/tmp:rw,nosuid,nodev,mode=1777",
        f"--pids-limit={isolation.DEFAULT_PIDS}",
        "--memory=8192m",
        "--cpus=4",
    ):
        assert flag in argv, flag
    assert "-p" not in argv and not any(a.startswith("--publish") for a in argv)
    assert not any("label=disable" in a for a in argv)  # no virtiofs mount, no reason to drop labels
    assert argv.index(IMG) > argv.index("--network=none")  # flags belong to podman, not the command


def test_podman_run_limits_come_from_flags_and_the_model_mount_drops_labels() -> None:
    argv = _plan(limits=isolation.GuestLimits(memory_mib=2048, cpus=2, pids=64), model_path=Path("/Users/me/m/q.gguf"))
    assert {"--memory=2048m", "--cpus=2", "--pids-limit=64"} <= set(argv)
    assert "--security-opt=label=disable" in argv
    assert argv[argv.index("-v") + 1] == "/Users/me/m/q.gguf:/models/q.gguf:ro"
    assert "XDG_CACHE_HOME=/tmp/.cache" in argv  # Mesa's cache on the writable tmpfs


def test_serve_plan_publishes_only_its_port_on_loopback() -> None:
    argv = _plan(publish=Publish("127.0.0.1", 18080, 8080))
    assert argv.count("-p") == 1 and argv[argv.index("-p") + 1] == "127.0.0.1:18080:8080"
    assert "--network=none" not in argv
    assert not any(a.startswith(("--network", "--net=", "--publish")) for a in argv)
    assert {"--cap-drop=ALL", "--read-only", "--security-opt=no-new-privileges"} <= set(argv)
    with pytest.raises(errors.InvalidValue):
        _plan(publish=Publish("127.0.0.1", 70000, 8080))


def test_doctor_reports_the_podman_run_flags_in_force() -> None:
    ctx = DoctorContext(platform="darwin", env={}, home=Path("/Users/me"), compat=COMPAT)
    (check,) = isolation_checks(ctx)
    assert check.id == "darwin.isolation" and check.status == "ok"
    flags = check.evidence.split("podman run ", 1)[1].split(";")[0].split()
    assert set(flags) <= set(_plan())  # what doctor says is what a run gets
    assert {"--network=none", "--cap-drop=ALL", "--read-only", "--security-opt=no-new-privileges"} <= set(flags)
