"""Route selection: the pure choice per host kind, the probes on real trees (a made-up Linux
/dev + /sys + /proc, a krun bundle of real shared libraries for macOS), the doctor row, and the
CLI refusing a GPU nothing can give (E007) before any VM, on this real host."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provision import hosts
from provision.bench import history_file
from provision.core import catalog
from provision.core.errors import GpuNotSupported, UnknownRoute
from provision.doctor.route import check_route
from provision.hosts.linux import route_facts as probe
from provision.routes.choose import HostFacts, RenderNode, choose, stack_for
from tests.helpers import run_provision
from tests.hosts.darwin.macos_fixtures import make_bundle

STACKS = catalog.load().stacks
LAVAPIPE = ("lvp_icd.json", "radeon_icd.json", "intel_icd.json")  # Mesa ships every driver's manifest


# --- Linux ---------------------------------------------------------------------------------------


def test_linux_without_a_render_node_is_venus_on_lavapipe_with_the_cpu_warning() -> None:
    d = choose(HostFacts("linux", vulkan_icds=LAVAPIPE), STACKS, gpu=True)
    assert (d.stack, d.route, d.cpu) == ("llama-linux", "venus", True)
    assert "lavapipe" in d.device and "WARNING: lavapipe is a CPU" in d.line()


def test_linux_render_node_means_venus_with_egl_headless_on_that_gpu() -> None:
    d = choose(HostFacts("linux", render_nodes=(RenderNode("/dev/dri/renderD128", "amdgpu"),),
                         vulkan_icds=LAVAPIPE), STACKS, gpu=True)  # fmt: skip
    assert (d.stack, d.route, d.cpu) == ("llama-linux", "venus", False)
    assert "renderD128 (amdgpu)" in d.line() and "egl-headless" in d.why and "WARNING" not in d.line()


def test_linux_nvidia_with_the_cuda_host_backend_means_apir() -> None:
    facts = HostFacts("linux", render_nodes=(RenderNode("/dev/dri/renderD128", "nvidia"),),
                      nvidia_gpus=("NVIDIA H200",), cuda_backend="/c/ggml/k/bin/libggml-cuda.so",
                      apir_host_tools=True, vulkan_icds=LAVAPIPE)  # fmt: skip
    d = choose(facts, STACKS, gpu=True)
    assert (d.stack, d.route) == ("llama-apir-linux", "apir")
    assert "NVIDIA H200" in d.why and "CUDA host backend" in d.why
    # without the CUDA build it stays on Venus on the render node and says what APIR would need
    d = choose(HostFacts("linux", render_nodes=facts.render_nodes, nvidia_gpus=facts.nvidia_gpus,
                         apir_host_tools=True), STACKS, gpu=True)  # fmt: skip
    assert (d.stack, d.route) == ("llama-linux", "venus") and "no CUDA host backend" in d.why


def test_linux_with_no_vulkan_at_all_is_e007_never_a_silent_cpu_run() -> None:
    with pytest.raises(GpuNotSupported, match="not reachable"):
        choose(HostFacts("linux"), STACKS, gpu=True)
    # a hardware ICD manifest without a render node has no device either
    with pytest.raises(GpuNotSupported):
        choose(HostFacts("linux", vulkan_icds=("radeon_icd.json", "nvidia_icd.json")), STACKS, gpu=True)


def test_linux_route_override() -> None:
    with pytest.raises(GpuNotSupported, match="APIR host side") as err:
        choose(HostFacts("linux", vulkan_icds=LAVAPIPE), STACKS, gpu=True, route="apir")
    assert "provision host-tools --apir" in err.value.fix
    d = choose(HostFacts("linux", vulkan_icds=LAVAPIPE, apir_host_tools=True), STACKS, gpu=True, route="apir")
    assert (d.stack, d.route) == ("llama-apir-linux", "apir")
    d = choose(HostFacts("linux", vulkan_icds=LAVAPIPE), STACKS, gpu=False, route="cpu")
    assert (d.stack, d.route) == ("cpu", "cpu")
    with pytest.raises(GpuNotSupported):
        choose(HostFacts("linux", vulkan_icds=LAVAPIPE), STACKS, gpu=True, route="cpu")
    with pytest.raises(UnknownRoute):
        choose(HostFacts("linux"), STACKS, gpu=True, route="cuda")


def test_the_stack_for_a_route_is_the_one_serving_it_on_the_fewest_hosts() -> None:
    assert stack_for(STACKS, "linux", "apir").name == "llama-apir-linux"  # type: ignore[union-attr]
    assert stack_for(STACKS, "darwin", "apir").name == "llama-apir"  # type: ignore[union-attr]
    assert stack_for(STACKS, "darwin", "venus").name == "llama"  # type: ignore[union-attr]
    assert stack_for(STACKS, "linux", "cpu").name == "cpu"  # type: ignore[union-attr]


def test_probe_reads_render_nodes_drivers_nvidia_and_icds_from_a_tree(tmp_path: Path) -> None:
    (tmp_path / "dev" / "dri").mkdir(parents=True)
    (tmp_path / "dev" / "dri" / "renderD128").touch()
    (tmp_path / "dev" / "dri" / "card0").touch()
    drivers = tmp_path / "sys" / "bus" / "pci" / "drivers" / "amdgpu"
    drivers.mkdir(parents=True)
    dev = tmp_path / "sys" / "class" / "drm" / "renderD128" / "device"
    dev.mkdir(parents=True)
    os.symlink(drivers, dev / "driver")
    gpu = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:01:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA H200\nIRQ:   \t\t 42\n")
    icd = tmp_path / "usr" / "share" / "vulkan" / "icd.d"
    icd.mkdir(parents=True)
    for name in ("lvp_icd.json", "virtio_icd.json", "radeon_icd.json"):
        (icd / name).write_text("{}")
    assert probe.render_nodes(tmp_path) == (RenderNode("/dev/dri/renderD128", "amdgpu"),)
    assert probe.nvidia_gpus(tmp_path) == ("NVIDIA H200",)
    # the guest's virtio ICD is no host device
    assert probe.vulkan_icds([tmp_path]) == ("lvp_icd.json", "radeon_icd.json")


def test_probe_finds_a_cached_cuda_build_and_a_measured_apir_speedup(empty_cache: Path) -> None:
    assert probe.cuda_backend() is None and history_file.apir_speedup_measured() is None
    build = empty_cache / "ggml" / "k1"
    (build / "bin").mkdir(parents=True)
    (build / "build.json").write_text(json.dumps({"variant": "cuda"}))
    assert probe.cuda_backend() is None  # a manifest without the library is no backend
    (build / "bin" / "libggml-cuda.so").write_bytes(b"\x7fELF")
    assert probe.cuda_backend() == str(build / "bin" / "libggml-cuda.so")
    (empty_cache / "bench").mkdir()
    rows = [{"where": "guest-apir", "test": "tg16", "tokens_per_s": 30.0},
            {"where": "guest-gpu", "test": "tg16", "tokens_per_s": 20.0},
            {"where": "guest-gpu", "test": "pp256", "tokens_per_s": 900.0}]  # fmt: skip
    (empty_cache / "bench" / "llama-apir-1.json").write_text(json.dumps({"results": rows}))
    assert history_file.apir_speedup_measured() == pytest.approx(1.5)


# --- macOS (recorded inputs: a bundle of real libraries, the recorded machine route) ----------------


def test_macos_default_is_venus_through_krunkit() -> None:
    d = choose(HostFacts("darwin", krun_bundle="/b/bin/krunkit"), STACKS, gpu=True)
    assert (d.stack, d.route) == ("llama", "venus") and "krunkit" in d.why and not d.cpu


def test_macos_apir_when_installed_and_asked_for_measured_faster_or_running() -> None:
    base = HostFacts("darwin", krun_bundle="/b/bin/krunkit", apir_bundle=True)
    assert choose(base, STACKS, gpu=True).route == "venus"  # installed alone is not enough
    assert "--route apir to use it" in choose(base, STACKS, gpu=True).why
    assert choose(base, STACKS, gpu=True, route="apir").stack == "llama-apir"
    faster = HostFacts("darwin", krun_bundle="/b", apir_bundle=True, apir_speedup=1.4)
    assert choose(faster, STACKS, gpu=True).route == "apir" and "1.40x" in choose(faster, STACKS, gpu=True).why
    slower = HostFacts("darwin", krun_bundle="/b", apir_bundle=True, apir_speedup=0.7)
    assert choose(slower, STACKS, gpu=True).route == "venus"
    running = HostFacts("darwin", krun_bundle="/b", apir_bundle=True, machine_route="apir")
    assert choose(running, STACKS, gpu=True).route == "apir"


def test_macos_unreachable_gpu_is_e007() -> None:
    with pytest.raises(GpuNotSupported, match="no krun bundle"):
        choose(HostFacts("darwin"), STACKS, gpu=True)
    with pytest.raises(GpuNotSupported, match="no APIR host backend"):
        choose(HostFacts("darwin", krun_bundle="/b"), STACKS, gpu=True, route="apir")


def test_macos_probe_on_a_real_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PROVISION_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    assert hosts.get("darwin").route_facts().krun_bundle is None
    make_bundle(tmp_path / ".nix-profile", apir=False)
    f = hosts.get("darwin").route_facts()
    assert f.krun_bundle == str(tmp_path / ".nix-profile" / "bin" / "krunkit") and not f.apir_bundle
    assert choose(f, STACKS, gpu=True).stack == "llama"


def test_macos_probe_sees_the_apir_libraries_and_the_machine_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provision.hosts.darwin import machine_state

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PROVISION_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    make_bundle(tmp_path / ".nix-profile", apir=True)
    machine_state.record_route("podman-machine-default", "apir", virglrenderer=None)
    f = hosts.get("darwin").route_facts()
    assert f.apir_bundle and f.machine_route == "apir"
    assert choose(f, STACKS, gpu=True).stack == "llama-apir"


# --- the doctor row and the CLI on this host ------------------------------------------------------


def test_doctor_row_is_the_same_decision() -> None:
    facts = HostFacts("linux", vulkan_icds=LAVAPIPE)
    row = check_route(facts, STACKS)
    assert row.id == "route.auto" and row.status == "warn"
    assert row.evidence == choose(facts, STACKS, gpu=True).line()
    gpu = HostFacts("linux", render_nodes=(RenderNode("/dev/dri/renderD128", None),))
    assert check_route(gpu, STACKS).status == "ok"
    bad = check_route(HostFacts("linux"), STACKS)
    assert bad.status == "fail" and bad.evidence.startswith("E007") and bad.fix and "provision host-tools" in bad.fix


def test_doctor_prints_the_route_row() -> None:
    proc = run_provision("doctor", "--json", timeout=300)
    rows = {c["id"]: c for c in json.loads(proc.stdout)["data"]["checks"]}
    assert rows["route.auto"]["evidence"].startswith("route: "), rows["route.auto"]


def test_run_without_a_stack_needs_gpu_or_a_route() -> None:
    proc = run_provision("run", "--", "true")
    assert proc.returncode == 13 and "E003" in proc.stderr and "--gpu" in proc.stderr


def test_the_icds_are_what_the_vulkan_loader_would_read(tmp_path: Path) -> None:
    folder = tmp_path / "icd.d"
    folder.mkdir()
    (folder / "lvp_icd.x86_64.json").write_text("{}")
    (tmp_path / "nvidia_icd.json").write_text("{}")
    for tree, icd in (("host", "intel_icd.x86_64.json"), ("bundle", "lvp_icd.json"), ("chroot", "radeon_icd.json")):
        (tmp_path / tree / "usr/share/vulkan/icd.d").mkdir(parents=True)
        (tmp_path / tree / "usr/share/vulkan/icd.d" / icd).write_text("{}")
    host, bundle, chroot = tmp_path / "host", tmp_path / "bundle", tmp_path / "chroot"
    assert probe.vulkan_icds([host, bundle], [chroot]) == ("intel_icd.x86_64.json", "lvp_icd.json", "radeon_icd.json")
    # an override replaces the search folders of what runs with this environment (a bundle too), never a chroot's
    listed = f"{folder}:{tmp_path / 'nvidia_icd.json'}:{tmp_path / 'gone'}"
    for key in probe.LOADER_OVERRIDES:
        assert probe.vulkan_icds([host, bundle], [chroot], {key: listed}) == (
            "lvp_icd.x86_64.json", "nvidia_icd.json", "radeon_icd.json")  # fmt: skip
    # VK_DRIVER_FILES is read before VK_ICD_FILENAMES; an empty one is no override
    both = {"VK_DRIVER_FILES": str(tmp_path / "nvidia_icd.json"), "VK_ICD_FILENAMES": str(folder)}
    assert probe.vulkan_icds([host], [], both) == ("nvidia_icd.json",)
    assert probe.vulkan_icds([host], [], {"VK_DRIVER_FILES": ""}) == ("intel_icd.x86_64.json",)
    # VK_ADD_DRIVER_FILES adds to the search, and is off under an override
    added = {"VK_ADD_DRIVER_FILES": str(tmp_path / "nvidia_icd.json")}
    assert probe.vulkan_icds([host], [], added) == ("intel_icd.x86_64.json", "nvidia_icd.json")
    assert probe.vulkan_icds([host], [], {**added, "VK_DRIVER_FILES": str(folder)}) == ("lvp_icd.x86_64.json",)


def test_run_gpu_with_nothing_to_run_it_on_is_e007_before_any_vm(tmp_path: Path) -> None:
    """No render node here, and host tools with no Vulkan ICD: nothing can give a GPU. The host's own
    drivers (CI installs lavapipe for the replay harness) are hidden as the Vulkan loader would hide them."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tmp_path / "no-icds").mkdir()
    env = {"PROVISION_HOST_TOOLS": str(tools), "PROVISION_CACHE": str(tmp_path / "cache"),
           "VK_DRIVER_FILES": str(tmp_path / "no-icds")}  # fmt: skip
    if probe.render_nodes(Path("/")) or probe.vulkan_icds([Path("/")], [], env):
        pytest.fail("this test needs a host without /dev/dri")
    for argv in (("run", "--gpu", "--", "true"), ("serve", "--gpu", "--model", "tiny-llama"), ("bench",)):
        proc = run_provision(*argv, env=env)
        assert proc.returncode == 17, (argv, proc.stderr)
        assert "E007" in proc.stderr and "not reachable" in proc.stderr and "fix:" in proc.stderr
        assert "qemu pid=" not in proc.stderr


def test_named_stack_and_stack_option_agree_or_fail() -> None:
    proc = run_provision("run", "cpu", "--stack", "llama-linux", "--", "true")
    assert proc.returncode == 13 and "name one stack" in proc.stderr
    proc = run_provision("run", "--stack", "cpu", "--gpu", "--", "true")
    assert proc.returncode == 17 and "E007" in proc.stderr  # --stack is as binding as the positional
