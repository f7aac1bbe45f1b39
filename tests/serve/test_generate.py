"""`provision serve --generate quadlet|kube` (a Mac's podman machine): checked by the programs that read them.

The quadlet unit goes through podman's own quadlet generator (from the pinned sid podman: the
host's podman 4.3 has none) and the .service it makes through `systemd-analyze verify`; the Pod
YAML through the Kubernetes Pod schema (kubernetes-validate, offline) and `podman kube play
--start=false` here (this host has no /dev/dri, the podman machine does: the test plays the Pod with
that one hostPath moved to a directory this host has, and shows it is the only thing that differs).
The Linux unit (`--generate systemd`) is tested in test_generate_unit.py.
"""

from __future__ import annotations

import hashlib
import json
import os
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

IMAGE = "localhost/krun-gpu/llama:0123456789ab"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "models" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF")
    return path


def served(path: Path, **kw: object) -> generate.Served:
    base: dict[str, object] = {"stack": catalog.load().get("llama"), "image": IMAGE, "model_path": path,
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
    args = ("serve", "llama", "--target", "darwin", "--model", str(model), "--gpu", "--port", "8282",
            "--generate", "quadlet", "--output", str(out))  # fmt: skip
    proc = run_provision(*args)
    assert proc.returncode == 0, proc.stderr
    assert "on darwin serve runs llama as a container in the podman machine" in proc.stderr
    text = out.read_text()
    assert text.startswith("# llama-8282.container") and "PublishPort=127.0.0.1:8282:8080" in text
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


@pytest.mark.parametrize("fmt", ["quadlet", "kube"])
def test_on_linux_a_container_unit_is_refused_naming_the_unit_that_runs_what_serve_runs(model: Path, tmp_path: Path,
                                                                                         fmt: str) -> None:  # fmt: skip
    out = tmp_path / "unit"
    proc = run_provision("serve", "llama-linux", "--target", "linux", "--model", str(model), "--gpu",
                         "--generate", fmt, "--output", str(out))  # fmt: skip
    assert proc.returncode == 13 and "runs llama-linux in a QEMU guest" in proc.stderr, proc.stderr
    assert "fix: --generate systemd" in proc.stderr and not out.exists()
    with pytest.raises(InvalidValue, match="QEMU guest"):
        generate.render(fmt, served(model, stack=catalog.load().get("llama-linux")))


# --- a split model -------------------------------------------------------------------------------


@pytest.fixture
def split(tmp_path: Path) -> Path:
    """Part 1 of a three-part split GGUF, its siblings beside it (as the store links them)."""
    folder = tmp_path / "split" / "big"
    folder.mkdir(parents=True)
    for k in (1, 2, 3):
        (folder / f"big-Q4_K_M-{k:05d}-of-00003.gguf").write_bytes(b"GGUF" + bytes([k]))
    return folder / "big-Q4_K_M-00001-of-00003.gguf"


def test_every_part_of_a_split_model_is_mounted_under_its_own_name(quadlet: Path, split: Path, tmp_path: Path) -> None:
    names = [f"big-Q4_K_M-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]
    s = served(split, model="big-Q4_K_M")
    _, services = quadlet_run(quadlet, generate.quadlet(s), "tiny-8181", tmp_path)
    exec_start = next(line for line in services["tiny-8181.service"].splitlines() if line.startswith("ExecStart="))
    for name in names:
        assert f"-v {split.parent / name}:/models/{name}:ro" in exec_start
    assert f"llama-server -m /models/{names[0]} " in exec_start
    pod = generate.pod(s)
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}  # type: ignore[index]
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}  # type: ignore[index]
    assert {inside: paths[vol] for inside, vol in mounts.items() if vol in paths} == {
        **{f"/models/{n}": str(split.parent / n) for n in names}, "/dev/dri": "/dev/dri"}  # fmt: skip
    (split.parent / names[2]).unlink()
    with pytest.raises(InvalidValue, match="is missing"):
        generate.pod(s)


@pytest.fixture(scope="session")
def empty_image() -> str:
    """A local image with nothing in it: kube play --start=false creates containers, it runs none."""
    name = "localhost/krun-gpu-test/empty:1"
    if subprocess.run(["podman", "image", "exists", name], timeout=60).returncode == 0:
        return name  # an import each run would leave the last one untagged
    proc = subprocess.run(["podman", "import", "-q", "-", name], input=b"\0" * 10240, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    return name


def kube_play(pod: dict[str, object], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod, sort_keys=False))
    return subprocess.run(["podman", "kube", "play", "--start=false", str(path)], capture_output=True, text=True,
                          timeout=300)  # fmt: skip


@pytest.mark.slow
@pytest.mark.podman
def test_podman_kube_play_accepts_the_pod_where_dev_dri_exists(split: Path, empty_image: str, tmp_path: Path) -> None:
    assert shutil.which("catatonit"), "podman kube play needs catatonit for its pause image: scripts/setup-debian"
    assert not Path(generate.DEVICE).exists(), "this test moves /dev/dri because this host has none"
    name = f"gen-{os.getpid()}"
    pod = generate.pod(served(split, model="big-Q4_K_M", name=name, image=empty_image))
    # As written (for the podman machine), only the render nodes are missing here.
    refused = kube_play(pod, tmp_path)
    assert refused.returncode != 0 and "/dev/dri" in refused.stderr, refused.stderr
    subprocess.run(["podman", "pod", "rm", "-f", name], capture_output=True, timeout=120)
    for volume in pod["spec"]["volumes"]:  # type: ignore[index]
        if volume["name"] == "dri":
            volume["hostPath"]["path"] = str(tmp_path)
    try:
        played = kube_play(pod, tmp_path)
        assert played.returncode == 0, played.stderr
        info = subprocess.run(["podman", "inspect", f"{name}-llama-server", "--format", "json"], capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        container = json.loads(info.stdout)[0]
        mounts = {m["Destination"]: m["Source"] for m in container["Mounts"]}
        for k in (1, 2, 3):
            part = f"big-Q4_K_M-{k:05d}-of-00003.gguf"
            assert mounts[f"/models/{part}"] == str(split.parent / part)
        assert [container["Path"], *container["Args"][:2]] == ["llama-server", "-m",
                                                               "/models/big-Q4_K_M-00001-of-00003.gguf"]  # fmt: skip
        assert container["State"]["Status"] == "created"  # --start=false: created, never run
    finally:
        subprocess.run(["podman", "pod", "rm", "-f", name], capture_output=True, timeout=120)


def test_an_ollama_model_s_template_goes_into_the_pod_and_the_quadlet_says_it_cannot_carry_it(model: Path) -> None:
    from provision.serve import engine, model_defaults

    found = model_defaults.from_layers("{{ .System }}\n USER: {{ .Prompt }} ASSISTANT:", {"temperature": 0.2})
    assert found.chat_template is not None
    s = served(model, options=engine.ServerOptions(chat_template=found.chat_template, model_args=found.args))
    command = yaml.safe_load(generate.kube(s))["spec"]["containers"][0]["command"]
    assert command[command.index("--chat-template") + 1] == found.chat_template
    assert command[command.index("--temp") + 1] == "0.2"
    unit = generate.quadlet(s)
    assert "--chat-template" not in unit and "--temp 0.2" in unit
    assert "# The model's ollama template is not here" in unit
