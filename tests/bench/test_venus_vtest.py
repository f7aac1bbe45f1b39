"""bench/venus_vtest.py: Venus over vtest against the host driver (issue 40).

The fast tests check how a run's device is recognised (Venus on the target, or the target's
own driver, never a CPU fallback) and how the per-token profile is made. The slow one runs the
bench on lavapipe in the host-tools chroot, through our patched vtest server: the gate is
correctness only, the same greedy text natively and through Venus.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from provision.core import pins as pins_mod
from provision.core.errors import GpuNotSupported
from provision.hosts.linux.vtest import server as vtest_server
from provision.hosts.linux.vtest import venus as vtest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "venus_vtest.py"

# ggml-vulkan's device lines as the lent H200 and lavapipe printed them (2026-12-03).
VENUS_H200 = ("ggml_vulkan: 0 = Virtio-GPU Venus (NVIDIA H200) (venus) | uma: 0 | fp16: 1 | bf16: 1 | fp4: 0 | "
              "warp size: 32 | shared memory: 49152 | int dot: 1 | matrix cores: KHR_coopmat\n")
NATIVE_H200 = "ggml_vulkan: 0 = NVIDIA H200 (NVIDIA) | uma: 0 | fp16: 1 | bf16: 1 | warp size: 32\n"
LAVAPIPE = "ggml_vulkan: 0 = llvmpipe (LLVM 22.1.8, 256 bits) (llvmpipe) | uma: 0 | fp16: 1 | bf16: 0\n"
VENUS_LAVAPIPE = "ggml_vulkan: 0 = Virtio-GPU Venus (llvmpipe (LLVM 22.1.8, 256 bits)) (venus) | uma: 0 | fp16: 1\n"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("venus_vtest", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_lines_give_name_and_driver_once_per_device() -> None:
    assert vtest.devices(VENUS_H200 + VENUS_H200) == [vtest.Device(0, "Virtio-GPU Venus (NVIDIA H200)", "venus")]
    assert vtest.devices(LAVAPIPE)[0].name == "llvmpipe (LLVM 22.1.8, 256 bits)"
    log = "I llama_prepare_model_devices: using device Vulkan0 (Virtio-GPU Venus (NVIDIA H200)) (unknown id) - 1 MiB\n"
    assert vtest.used(log * 2) == [vtest.Device(0, "Virtio-GPU Venus (NVIDIA H200)", "")]


@pytest.mark.parametrize(("stderr", "target", "venus"), [
    (VENUS_H200, "nvidia", True), (NATIVE_H200, "nvidia", False),
    (LAVAPIPE, "lavapipe", False), (VENUS_LAVAPIPE, "lavapipe", True),
])
def test_the_asked_device_is_accepted(stderr: str, target: str, venus: bool) -> None:
    assert vtest.expect(stderr, target, venus).index == 0


@pytest.mark.parametrize(("stderr", "target", "venus"), [
    (VENUS_H200, "nvidia", False),  # Venus where the host driver was asked for
    (NATIVE_H200, "nvidia", True),  # the host driver where Venus was asked for
    (VENUS_LAVAPIPE, "nvidia", True),  # Venus on the wrong driver
    ("ggml_vulkan: No devices found.\n", "nvidia", False),  # ggml would run on the CPU
    (LAVAPIPE + LAVAPIPE.replace("0 =", "1 ="), "lavapipe", False),  # two drivers seen
])
def test_anything_else_is_e007_not_a_number(stderr: str, target: str, venus: bool) -> None:
    with pytest.raises(GpuNotSupported) as exc:
        vtest.expect(stderr, target, venus)
    assert exc.value.code == "E007" and exc.value.fix


def test_each_client_sees_one_driver_and_the_server_its_render_server(tmp_path: Path) -> None:
    place = vtest.Place(Path("/chroot"), True, tmp_path, tmp_path / "m", vtest.CHROOT_ICDS["lavapipe"])
    venus = vtest.client_env(place, True, "no_cmd_batching")
    assert venus["VK_DRIVER_FILES"] == vtest.CHROOT_ICDS["venus"] and venus["VN_DEBUG"] == "vtest"
    assert venus["VTEST_SOCKET_NAME"] == "/vtest/venus.sock" == place.socket
    assert venus["VN_PERF"] == "no_cmd_batching"
    assert vtest.client_env(place, False)["VK_DRIVER_FILES"] == vtest.CHROOT_ICDS["lavapipe"]
    assert "VN_DEBUG" not in vtest.client_env(place, False)
    server = vtest.server_env(place)
    assert server["RENDER_SERVER_EXEC_PATH"] == "/" + vtest_server.INSTALLED[vtest.RENDER_SERVER]
    assert vtest.server_args(place)[:3] == ["--venus", "--no-virgl", "--multi-clients"]
    argv, _ = place.command(vtest.SERVER, ["--venus"], server)
    assert "/" + vtest_server.INSTALLED[vtest.SERVER] in argv and f"LD_LIBRARY_PATH=/{vtest_server.LIB}" in argv


def test_the_server_is_built_with_every_patch_its_pin_lists_and_rebuilt_when_one_changes() -> None:
    pins = pins_mod.default()
    pin = pins.require(vtest_server.PIN, purpose="the vtest server")
    applied = vtest_server.patches(pin)
    assert [p.name for p in applied] == ["vtest-pass-opaque-blob-fd.patch", "venus-shm-backed-mappable-memory.patch",
                                         "vtest-count-commands.patch"]
    stamp = vtest_server.wanted(pins, pin)
    assert stamp["patches"] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in applied]
    fewer = replace(pin, attrs={**pin.attrs, "patches": pin["patches"][:1]})
    assert vtest_server.wanted(pins, fewer) != stamp  # a server built without the shm patch is not reused


def test_per_token_is_the_difference_of_the_two_runs() -> None:
    mod = load()
    one = {"wall_s": 1.0, "profile": {"client": {"cpu_s": 0.5, "syscalls": 100}},
           "states": {"client": {"futex": 10, "running": 5}}}
    many = {"wall_s": 3.0, "profile": {"client": {"cpu_s": 1.5, "syscalls": 300}},
            "states": {"client": {"futex": 50, "running": 5}}}
    got = mod.per_token(one, many, 1000)
    assert got["wall_us"] == 2000.0 and got["client"] == {"cpu_us": 1000.0, "syscalls": 0.2}
    assert got["samples"]["client"] == {"futex": 40, "running": 0}


def test_bad_input_is_a_coded_error_not_a_traceback() -> None:
    for args in (["-r", "1"], ["--vn-perf", "x;rm"], ["--model", "/nonexistent.gguf"],
                 ["--fence-iterations", "1"]):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)
        assert proc.returncode != 0 and "E003" in proc.stderr and "fix:" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.root
# Without patches/virglrenderer/venus-shm-backed-mappable-memory.patch the client maps lavapipe's
# opaque fd at offset 0, reads its private header instead of the memory, and decodes '#' tokens
# (bench/results/venus-vtest.md, sections 3 and 4).
def test_lavapipe_through_venus_gives_the_same_greedy_tokens_as_natively(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "-p", "32", "-n", "8", "-r", "2", "--greedy", "12",
                           "--commands", "--work", str(tmp_path / "w"), "--json", str(out)],
                          capture_output=True, text=True, timeout=3000, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["native_device"].startswith("llvmpipe")
    assert report["venus_device"].startswith("Virtio-GPU Venus (llvmpipe")
    for test in ("pp32", "tg8"):
        r = report["results"][test]
        assert r["native"]["driver"] == "llvmpipe" and r["venus"]["driver"] == "venus"
        assert r["native"]["ts"] > 0 and r["venus"]["ts"] > 0
        # the Venus run went through the server: its render server did work for it
        assert r["venus"]["profile"]["render"]["cpu_s"] > 0
    g = report["greedy"]
    assert g["same"] and g["native"]["eval_runs"] >= 1 and g["venus"]["eval_runs"] == g["native"]["eval_runs"]
    assert g["venus"]["text"].replace("\u2581", " ").strip().startswith("t1 t2 t3")
    assert "ERROR_COMMAND_DISPATCH" not in report["server_log_tail"]
    assert "greedy 12 tokens: same" in proc.stdout
    # The fence probe ran both ways on the devices asked for, and every one of its transfers landed
    # (it exits non-zero otherwise); the times are the report's, not a gate.
    fence = report["fence_wait"]
    assert fence["native"]["driver"] == "llvmpipe" and fence["venus"]["driver"] == "venus"
    assert all(r["iterations"] == 300 and r["wait_us"] > 0 and r["poll_us"] > 0 for r in fence.values())
    assert "one small transfer, submitted and waited for" in proc.stdout
    # Per decoded token the client submits through the socket (SUBMIT_CMD2) and waits on a vtest sync,
    # as the server counted them (vtest-count-commands.patch).
    per = report["results"]["tg8"]["venus"]["commands_per_token"]
    # (SYNC_READ, ggml's spin on the graph's fence, varies with load: before the first token too.)
    assert per["SUBMIT_CMD2"] >= 1 and per.get("SYNC_WAIT", 0) + per.get("SYNC_WRITE", 0) >= 1, per
    assert "tg8 through Venus, vtest commands per token: " in proc.stdout



def test_each_departed_clients_commands_are_read_from_the_server_log_in_order() -> None:
    mod = load()
    log = ("vtest_client_dispatch_commands: client context created.\n"
           "client: VTEST_CLIENT_DISCONNECTED\n"
           "client: commands GET_CAPSET=1 SYNC_READ=40 SUBMIT_CMD2=12\n"
           "client: commands\n"                     # a client that sent nothing after CREATE_RENDERER
           "client: commands SUBMIT_CMD2=x\n"        # not a count: not a line of ours
           "client: commands SYNC_WAIT=3 SUBMIT_CMD2=30\n")
    assert mod.client_commands(log) == [{"GET_CAPSET": 1, "SYNC_READ": 40, "SUBMIT_CMD2": 12}, {},
                                        {"SYNC_WAIT": 3, "SUBMIT_CMD2": 30}]


def test_the_server_counts_commands_only_where_asked() -> None:
    # The counting is our patch's and gated by the variable: the bench's server sets it.
    patch = (REPO / "patches" / "virglrenderer" / "vtest-count-commands.patch").read_text()
    assert 'getenv("VTEST_COUNT_COMMANDS")' in patch and "client: commands" in patch
    place = vtest.Place(Path("/r"), True, Path("/w"), Path("/m"), "/icd.json")
    assert vtest.server_env(place)["VTEST_COUNT_COMMANDS"] == "1"

def test_a_greedy_run_whose_log_was_cut_short_at_exit_runs_again_and_says_so(tmp_path: Path) -> None:
    mod = load()
    place = vtest.Place(tmp_path / "root", True, tmp_path, tmp_path, "/icd.json")
    run = mod.Run(place, "lavapipe", tmp_path / "m.gguf", tmp_path)
    done = "llama_perf_context_print:        eval time =      20.25 ms /    11 runs\n"
    logs = iter(["common_perf_print:    samplers time =       0.10 ms /    28 tokens\n", done])
    calls: list[bool] = []

    def client(program: str, args: list[str], via_venus: bool, timeout: float) -> dict[str, object]:
        calls.append(via_venus)
        return {"stdout": "t1 t2 t3 w4", "stderr": next(logs), "device": "d", "driver": "venus"}

    run.client = client  # type: ignore[method-assign]
    got = run.greedy(True, 12)
    assert calls == [True, True] and got["attempts"] == 2 and got["eval_runs"] == 11
    # never more than asked: a log always cut short is reported as such (0 runs), not retried forever
    logs = iter(["cut\n"] * 5)
    got = run.greedy(True, 12, attempts=3)
    assert got["attempts"] == 3 and got["eval_runs"] == 0 and len(calls) == 5


@pytest.mark.slow
@pytest.mark.root
# The lent machine runs a staged tree (--stage), not the chroot: here the same tree runs on this host's
# own lavapipe (Debian 12's Mesa, mesa-vulkan-drivers), natively and behind the tree's render server,
# so the device's path (wrappers, the tree's loader and libraries, the fence probe staged with them,
# the server's command counts) is shown to work before device time is spent on it.
def test_a_staged_tree_runs_the_bench_on_this_hosts_driver_as_on_the_lent_machine(tmp_path: Path) -> None:
    from provision.models import store

    tree = tmp_path / "tree"
    staged = subprocess.run([sys.executable, str(SCRIPT), "--stage", str(tree)], capture_output=True, text=True,
                            timeout=3000, check=False)
    assert staged.returncode == 0, staged.stderr[-3000:]
    stamp = json.loads((tree / vtest.STAGE_STAMP).read_text())
    assert "usr/bin/krun-fence-wait" in stamp["programs"]
    assert not list(tree.rglob("libvulkan_lvp.so")), "the tree brings no driver but venus"
    icd = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tree", str(tree), "--target", "lavapipe", "--native-icd",
                           str(icd), "--model", str(store.ensure("tiny-llama")), "-p", "8", "-n", "4", "-r", "2",
                           "--greedy", "4", "--commands", "--fence-iterations", "50", "--work", str(tmp_path / "w"),
                           "--json", str(out)], capture_output=True, text=True, timeout=3000, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["native_device"].startswith("llvmpipe (LLVM 15")  # the host's, not the chroot's LLVM 22
    assert report["venus_device"].startswith("Virtio-GPU Venus (llvmpipe (LLVM 15")
    assert report["greedy"]["same"] and report["fence_wait"]["venus"]["driver"] == "venus"
    assert report["results"]["tg4"]["venus"]["commands_per_token"]["SUBMIT_CMD2"] >= 1


def test_the_fence_probe_is_checked_like_llama_cpp_and_a_garbled_report_is_a_coded_error(tmp_path: Path) -> None:
    from provision.core.errors import HostToolsMissing

    mod = load()
    place = vtest.Place(tmp_path / "root", True, tmp_path, tmp_path, "/icd.json")
    run = mod.Run(place, "lavapipe", tmp_path / "m.gguf", tmp_path)
    outs = iter(['{"device": "llvmpipe (LLVM 22.1.8, 256 bits)", "driver": "llvmpipe", "wait_us": 14.5}\n',
                 '{"device": "llvmpipe (LLVM 22.1.8, 256 bits)", "driver": "llvmpipe", "wait_us": 14.5}\n',
                 "Segmentation fault\n"])

    def client(program: str, args: list[str], via_venus: bool, timeout: float, llama: bool) -> dict[str, object]:
        assert not llama  # no ggml device lines to read: the probe's own report is checked
        return {"stdout": next(outs), "stderr": ""}

    run.client = client  # type: ignore[method-assign]
    assert run.fence_wait("vtest/fence-wait", False, 10)["wait_us"] == 14.5
    with pytest.raises(GpuNotSupported):  # lavapipe itself where Venus was asked for: a CPU fallback, refused
        run.fence_wait("vtest/fence-wait", True, 10)
    with pytest.raises(HostToolsMissing, match="printed no report"):
        run.fence_wait("vtest/fence-wait", True, 10)


@pytest.mark.parametrize(("budget", "said"), [("x", "whole seconds, not 'x'"), ("1;2", "whole seconds, not '1;2'"),
                                              ("0069", "at least 70 s, not 69")])
def test_the_device_run_refuses_a_budget_it_cannot_keep_before_any_work(tmp_path: Path, budget: str, said: str) -> None:
    # `timeout 0` would run without a limit; a word would be read as a shell variable's name.
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(["bash", str(REPO / "checks" / "h200-venus-vtest" / "run"), str(tmp_path), str(tmp_path)],
                          env={"PATH": "/usr/bin:/bin", "OUT": str(out), "BUDGET": budget},
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"BUDGET must be {said}" in proc.stderr
    assert list(out.iterdir()) == []  # nothing started: no log, no environment capture
