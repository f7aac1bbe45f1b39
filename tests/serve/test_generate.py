"""`provision serve --generate quadlet|kube`: checked by the parsers that read them.

The quadlet unit goes through podman's own quadlet generator (from the pinned sid podman: the
host's podman 4.3 has none) and the .service it makes through `systemd-analyze verify`; the Pod
YAML through the Kubernetes Pod schema (kubernetes-validate, offline).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from provision.adapters import apt
from provision.core import catalog, pins
from provision.core.errors import GpuNotSupported, InvalidValue
from provision.core.paths import cache_dir
from provision.serve import generate
from tests.helpers import run_provision

IMAGE = "localhost/krun-gpu/llama-linux:0123456789ab"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    return path


def served(model: Path, **kw: object) -> generate.Served:
    base: dict[str, object] = {"stack": catalog.load().get("llama-linux"), "image": IMAGE, "model_path": model,
                               "model": "tiny-llama", "gpu": True, "port": 8181, "name": "tiny-8181"}  # fmt: skip
    base.update(kw)
    return generate.Served(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def quadlet() -> Path:
    """podman's quadlet generator from the pinned sid .deb (apt-get download, sha256-checked), cached."""
    deb_pins = pins.default().debian
    version, sha = deb_pins["test_packages"]["podman"], deb_pins["test_packages_sha256"]["podman"]
    root = cache_dir("test-fixtures", f"podman-{version}")
    binary = root / "tree/usr/libexec/podman/quadlet"
    if not binary.is_file():
        shutil.rmtree(root / "tree", ignore_errors=True)
        (root / "deb").mkdir(exist_ok=True)
        deb = apt.download("podman", version, suite=str(deb_pins["suite"]), dest=root / "deb")
        assert hashlib.sha256(deb.read_bytes()).hexdigest() == sha, f"{deb} does not match its pin"
        apt.extract(deb, root / "tree")
    assert binary.is_file()
    return binary


def quadlet_run(
    quadlet: Path, unit: str, name: str, tmp_path: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    units, out = tmp_path / "units", tmp_path / "generated"
    units.mkdir()
    out.mkdir()
    (units / f"{name}.container").write_text(unit)
    proc = subprocess.run([str(quadlet), "-no-kmsg-log", "-v", str(out)], capture_output=True, text=True,
                          env={"QUADLET_UNIT_DIRS": str(units), "PATH": "/usr/bin:/bin"}, timeout=60)  # fmt: skip
    return proc, {p.name: p.read_text() for p in out.glob("*.service")}


def test_the_quadlet_unit_is_read_by_quadlet_and_its_service_passes_systemd_analyze(
    quadlet: Path, model: Path, tmp_path: Path
) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze (systemd) is needed: scripts/setup-debian"
    unit = generate.quadlet(served(model))
    proc, services = quadlet_run(quadlet, unit, "tiny-8181", tmp_path)
    assert proc.returncode == 0 and "error" not in proc.stderr.lower(), proc.stderr
    assert list(services) == ["tiny-8181.service"], "quadlet made no service: it did not accept the unit"
    service = services["tiny-8181.service"]
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    assert "--device /dev/dri" in exec_start and "--publish 127.0.0.1:8181:8080" in exec_start
    assert f"-v {model}:/models/tiny-llama.gguf:ro" in exec_start and "--read-only" in exec_start
    assert exec_start.endswith(f"{IMAGE} llama-server -m /models/tiny-llama.gguf --alias tiny-llama --host 0.0.0.0 "
                               "--port 8080 --parallel 4 --n-gpu-layers 99 --device Vulkan0")  # fmt: skip
    path = tmp_path / "generated" / "tiny-8181.service"
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr.strip() == "", proc.stderr


def test_systemd_analyze_would_catch_a_broken_service(quadlet: Path, model: Path, tmp_path: Path) -> None:
    # The check above can fail: without its [Container] section quadlet refuses the unit and makes
    # no service, and a service with a bad ExecStart fails systemd-analyze.
    unit = generate.quadlet(served(model)).replace("[Container]", "[Nothing]")
    proc, services = quadlet_run(quadlet, unit, "tiny-8181", tmp_path)
    assert proc.returncode != 0 and "no Image" in proc.stderr and services == {}
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=relative/path\n")
    assert subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True).returncode != 0


def test_without_gpu_the_unit_has_no_device_and_runs_on_no_gpu(model: Path) -> None:
    unit = generate.quadlet(served(model, gpu=False))
    assert "AddDevice" not in unit and "--n-gpu-layers 0 --device none" in unit


@pytest.mark.parametrize("gpu", [True, False])
def test_the_pod_yaml_validates_against_the_kubernetes_pod_schema(model: Path, gpu: bool) -> None:
    text = generate.kube(served(model, gpu=gpu))
    pod = yaml.safe_load(text)
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    c = pod["spec"]["containers"][0]
    assert c["ports"] == [{"containerPort": 8080, "hostPort": 8181, "hostIP": "127.0.0.1", "protocol": "TCP"}]
    assert {"name": "model", "mountPath": "/models/tiny-llama.gguf", "readOnly": True} in c["volumeMounts"]
    assert ({"name": "dri", "mountPath": "/dev/dri"} in c["volumeMounts"]) is gpu
    assert c["command"][-2:] == (["--device", "Vulkan0"] if gpu else ["--device", "none"])


def test_the_schema_check_can_fail(model: Path) -> None:
    pod = generate.pod(served(model))
    pod["spec"]["containers"][0]["ports"][0]["hostPort"] = "8181"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"host": "0.0.0.0"}, "--host"),
        ({"host": "192.168.1.2"}, "--host"),
        ({"port": 0}, "--port"),
        ({"name": "Bad_Name"}, "--name"),
        ({"model_path": Path("/models/with space.gguf")}, "model path"),
        ({"model_path": Path("/models/x%i.gguf")}, "model path"),
        ({"model_path": Path("/models/$HOME.gguf")}, "model path"),
        ({"model_path": Path("relative.gguf")}, "absolute"),
        ({"image": "x\nExecStartPre=/bin/rm"}, "image"),
    ],
)
def test_values_that_would_break_or_widen_the_file_are_refused(model: Path, change: dict[str, object],
                                                                words: str) -> None:  # fmt: skip
    for fmt in generate.FORMATS:
        with pytest.raises(InvalidValue, match=words):
            generate.render(fmt, served(model, **change))


def test_gpu_on_a_stack_without_one_is_e007(model: Path) -> None:
    with pytest.raises(GpuNotSupported):
        generate.quadlet(served(model, stack=catalog.load().get("cpu")))


def test_cli_writes_the_file_whole_and_never_over_one_without_force(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "unit.container"
    args = ("serve", "llama-linux", "--model", str(model), "--gpu", "--port", "8282", "--generate", "quadlet",
            "--output", str(out))  # fmt: skip
    proc = run_provision(*args)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("# llama-linux-8282.container") and "PublishPort=127.0.0.1:8282:8080" in text
    out.write_text("mine\n")
    again = run_provision(*args)
    assert again.returncode == 13 and "E003" in again.stderr and "--force" in again.stderr
    assert out.read_text() == "mine\n"
    forced = run_provision(*args, "--force")
    assert forced.returncode == 0 and out.read_text() == text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
    missing = run_provision(*args[:-2])
    assert missing.returncode == 13 and "--output" in missing.stderr
    kube = run_provision(*args[:-3], "kube", "--output", str(tmp_path / "pod.yaml"))
    assert kube.returncode == 0, kube.stderr
    kubernetes_validate.validate(yaml.safe_load((tmp_path / "pod.yaml").read_text()), "1.37", strict=True)
