"""`provision serve --generate systemd`: on Linux the unit runs `provision serve` itself (a QEMU guest).

`systemd-analyze verify` reads the unit; its ExecStart, run with the unit's Environment= lines, is a
real `provision serve` that reaches the port check (E027 naming the port while a socket holds it),
so the unit's command line, package and settings are the ones serve takes.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.core import catalog
from provision.core.errors import GpuNotSupported, InvalidValue
from provision.serve import engine, generate_unit
from tests.helpers import run_provision

ROOT = Path(generate_unit.__file__).resolve().parents[2]


def unit(**kw: object) -> generate_unit.Unit:
    base: dict[str, object] = {"stack": catalog.load().get("llama-linux"), "model": "tiny-llama", "gpu": True,
                               "python": sys.executable, "package_root": str(ROOT), "port": 8181,
                               "name": "tiny-8181"}  # fmt: skip
    base.update(kw)
    return generate_unit.Unit(**base)  # type: ignore[arg-type]


def keys(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze (systemd) is needed: scripts/setup-debian"
    path = tmp_path / "tiny-8181.service"
    path.write_text(generate_unit.render(unit(options=engine.ServerOptions(temp=0.3, runtime_args=("--top-k", "9")))))
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr
    broken = tmp_path / "broken.service"  # the check can fail
    broken.write_text(path.read_text().replace(f"ExecStart={sys.executable}", "ExecStart=/nonexistent/python"))
    assert subprocess.run(["systemd-analyze", "verify", str(broken)], capture_output=True).returncode != 0


def test_the_unit_runs_provision_serve_restartable_and_stopping_the_guest_first() -> None:
    found = keys(generate_unit.render(unit(ctx=1024, options=engine.ServerOptions(temp=0.3, ngl=20))))
    argv = shlex.split(found["ExecStart"][0])
    assert argv[:5] == [sys.executable, "-m", "provision", "serve", "llama-linux"]
    assert " ".join(argv[5:]) == ("--model tiny-llama --name tiny-8181 --host 127.0.0.1 --port 8181 --parallel 4 "
                                  "--wait 900 --gpu --ctx-size 1024 --temp 0.3 --ngl 20")  # fmt: skip
    assert "--detach" not in argv  # systemd watches the serve itself
    assert found["Restart"] == ["on-failure"] and found["RestartPreventExitStatus"] == ["13 17"]
    # SIGTERM to serve alone: it stops its guest as on Ctrl-C, within the stop timeout
    assert found["KillMode"] == ["mixed"] and found["KillSignal"] == ["SIGTERM"]
    assert int(found["TimeoutStopSec"][0]) >= 90
    assert found["Environment"][0] == f"PYTHONPATH={ROOT}"


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_cli_writes_a_unit_whose_command_is_a_working_serve(listener: int, tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny.gguf"
    model.parent.mkdir()
    model.write_bytes(b"GGUF")
    out = tmp_path / "llama.service"
    cache = tmp_path / "cache"
    proc = run_provision("serve", "llama-linux", "--model", str(model), "--port", str(listener), "--generate",
                         "systemd", "--output", str(out), "--runtime-args", "--top-k 9",
                         env={"PROVISION_CACHE": str(cache)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "on linux serve runs llama-linux as a QEMU guest" in proc.stderr
    found = keys(out.read_text())
    env = dict(e.split("=", 1) for e in found["Environment"])
    assert env["PROVISION_CACHE"] == str(cache) and env["PYTHONPATH"] == str(ROOT)
    argv = shlex.split(found["ExecStart"][0])
    assert argv[argv.index("--model") + 1] == str(model) and argv[-1] == "--runtime-args=--top-k 9"
    served = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", **env})
    assert served.returncode == 37, served.stderr
    assert f"E027: cannot publish on 127.0.0.1:{listener}: port {listener} is in use" in served.stderr


def test_on_macos_a_systemd_unit_is_refused(tmp_path: Path) -> None:
    proc = run_provision("serve", "llama", "--target", "darwin", "--model", "tiny-llama", "--generate", "systemd",
                         "--output", str(tmp_path / "x.service"))  # fmt: skip
    assert proc.returncode == 13 and "fix: --generate quadlet or --generate kube" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"host": "0.0.0.0"}, "--host"),
        ({"name": "Bad_Name"}, "--name"),
        ({"model": "rel/x.gguf"}, "absolute"),
        ({"model": "/models/$HOME.gguf"}, "--model"),
        ({"python": "/usr/bin/py thon"}, "interpreter"),
        ({"env": {"PROVISION_CACHE": "/c%h"}}, "PROVISION_CACHE"),
        ({"env": {"HOME": "/root"}}, "not a provision setting"),
        ({"options": engine.ServerOptions(runtime_args=("--x", "$HOME"))}, "plain words"),
        ({"options": engine.ServerOptions(ngl=3)}, None),
        ({"stack": catalog.load().get("llama")}, "does not run on Linux"),
    ],
)
def test_values_that_would_break_or_widen_the_unit_are_refused(change: dict[str, object], words: str | None) -> None:
    if words is None:  # --ngl without --gpu
        generate_unit.render(unit(**change))
        with pytest.raises(InvalidValue, match="only with --gpu"):
            generate_unit.render(unit(gpu=False, **change))
        return
    with pytest.raises(InvalidValue, match=words):
        generate_unit.render(unit(**change))


def test_gpu_on_a_stack_without_one_is_e007() -> None:
    with pytest.raises(GpuNotSupported):
        generate_unit.render(unit(stack=catalog.load().get("cpu")))
