"""The Linux route really executed: QEMU (TCG here) + virglrenderer Venus + the host's
lavapipe, booting the llama-linux image built with podman.

Boots are the cost (each TCG boot is about a minute), so assertions are batched: one GPU
boot checks Vulkan, test-backend-ops and greedy text; `provision bench` is the second GPU
boot; one boot without GPU checks /dev/dri, the model mount and exit-status propagation;
the timeout and Ctrl-C tests stop QEMU early.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from provision.bench import history, history_file
from provision.core import catalog, isolation
from provision.hosts.linux.run import facts as linux
from provision.hosts.linux.run import perplexity as linux_perplexity
from provision.hosts.linux.run import slots
from provision.hosts.linux.tools import host_tools
from provision.models import store as models
from tests.helpers import gone, run_provision

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]

TBO = "/usr/libexec/x86_64-linux-gnu/llama.cpp-tests/test-backend-ops"
# Full MUL_MAT does not finish under TCG in 300 s; this set covers f16 and q4_0 weights, mat-vec and mat-mat.
MUL_MAT_FILTER = "type_a=(f16|q4_0),type_b=f32,m=16,n=(1|9),k=256"
PROMPT = "t1 t2 t3"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def provision(*args: str, timeout: float = 1200, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_provision(*args, timeout=timeout, env=env)


def qemu_pid(stderr: str) -> int:
    m = re.search(r"qemu pid=(\d+)", stderr)
    assert m, f"no qemu pid reported: {stderr[-800:]}"
    return int(m.group(1))


@pytest.fixture(scope="module")
def tools() -> Iterator[host_tools.HostTools]:
    """The host-tools chroot, made while the image builds (both mostly wait on the network)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        image_job = pool.submit(linux.root_disk, catalog.load().get("llama-linux"))
        made = host_tools.make()
        image_job.result()
    yield made


@pytest.fixture(scope="module")
def image(tools: host_tools.HostTools) -> None:
    """The image and its VM disk exist (made with the tools), so the tests below time boots, not builds."""


@pytest.fixture(scope="module")
def model() -> Path:
    """The model store's synthetic tiny llama (verified GGUF)."""
    return models.ensure("tiny-llama")


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^@@section (\S+)\n", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_gpu_guest_sees_venus_and_llama_cpp_runs_on_it(image: None, model: Path) -> None:
    script = f"""
echo "@@section dri"; ls /dev/dri
echo "@@section vulkaninfo"; vulkaninfo --summary 2>&1
echo "@@section devices"; llama-bench --list-devices 2>&1
for op in ADD RMS_NORM; do echo "@@section tbo-$op"; {TBO} test -b Vulkan0 -o $op 2>&1 | tail -n 20; done
echo "@@section tbo-MUL_MAT"; {TBO} test -b Vulkan0 -o MUL_MAT -p '{MUL_MAT_FILTER}' 2>&1 | tail -n 20
for d in Vulkan0 none; do
  echo "@@section completion-$d"
  llama-completion -m "$MODEL" -dev $d -ngl 99 -p '{PROMPT}' -n 12 --temp 0 -s 1 --no-warmup 2>/dev/null < /dev/null
done
"""
    proc = provision(
        "run", "llama-linux", "--gpu", "--model", str(model), "--timeout", "1100", "--", "sh", "-c", script
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = sections(proc.stdout)
    assert "renderD128" in out["dri"]
    assert "driverID           = DRIVER_ID_MESA_VENUS" in out["vulkaninfo"]
    assert re.search(r"deviceName\s+= Virtio-GPU Venus \(", out["vulkaninfo"])
    # the guest's own lavapipe must not be visible (the ICD is pinned to virtio)
    assert "DRIVER_ID_MESA_LLVMPIPE" not in out["vulkaninfo"]
    assert re.search(r"Vulkan0: Virtio-GPU Venus", out["devices"]), out["devices"]
    for op in ("ADD", "RMS_NORM", "MUL_MAT"):
        text = out[f"tbo-{op}"]
        m = re.search(r"(\d+)/(\d+) tests passed", text)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) > 0, f"{op}: {text}"
        assert re.search(r"Backend Vulkan0: \S*OK", text), f"{op}: {text}"
    gpu_text, cpu_text = (ANSI.sub("", out[f"completion-{d}"]).strip() for d in ("Vulkan0", "none"))
    assert gpu_text.replace("\u2581", " ").strip().startswith(PROMPT)
    assert len(gpu_text) > len(PROMPT) + 8  # the prompt plus generated tokens
    assert gpu_text == cpu_text


def test_bench_gate_holds_and_writes_table_json_png(image: None, model: Path, tmp_path: Path) -> None:
    proc = provision("bench", "llama-linux", "--model", str(model), "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads(proc.stdout)["data"]
    wheres = {(r["where"], r["test"][:2]) for r in report["results"]}
    assert {("guest-gpu", "pp"), ("guest-gpu", "tg"), ("guest-cpu", "pp")} <= wheres
    assert report["gate"]["holds"] and report["gate"]["factor"] >= 2.0
    assert json.loads(Path(report["json"]).read_text())["gate"] == report["gate"]
    assert Path(report["png"]).read_bytes()[:4] == b"\x89PNG"
    if report["host_native"]:
        assert "pp256" in report["remoting_ratio"]
    # The run is in the bench history: one record with what it measured and where.
    records, _ = history_file.load()
    record = history.pick(records, report["history"]["id"])
    assert record.kind == "bench" and record.stack == "llama-linux" and record.route == "venus"
    assert "Venus" in record.device and record.model_sha256 == models.Store().ref("tiny-llama").sha256
    assert record.llama_build["number"] or record.llama_build["commit"]
    assert [(m.where, m.test, m.value) for m in record.results] == [
        (r["where"], r["test"], r["tokens_per_s"]) for r in report["results"]
    ]
    cmp = provision("bench", "compare", record.id, "-1", "--json")
    assert cmp.returncode == 0, cmp.stderr
    rows = json.loads(cmp.stdout)["data"]["rows"]
    newest = records[-1]
    for row in rows:  # B/A, against the newest record (this one, unless another run appended since)
        a = next(m.value for m in record.results if (m.where, m.test) == (row["where"], row["test"]))
        b = next((m.value for m in newest.results if (m.where, m.test) == (row["where"], row["test"])), None)
        assert row["ratio"] == (None if b is None else pytest.approx(b / a))
    assert "pp256" in provision("bench", "list", "--stack", "llama-linux").stdout


def test_perplexity_on_the_guest_gpu_parses_a_number_and_is_recorded(image: None, model: Path) -> None:
    proc = provision("perplexity", "llama-linux", "--model", "tiny-llama", "--gpu", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    data = json.loads(proc.stdout)["data"]
    assert data["where"] == "guest-gpu" and isinstance(data["ppl"], float)
    # A random 512-token model on English bytes: far from 1 (perfect), and finite.
    assert 1.0 < data["ppl"] < 1e6 and data["error"] >= 0
    assert data["text_sha256"] == hashlib.sha256(linux_perplexity.default_text().read_bytes()).hexdigest()
    record = history.pick(history_file.load()[0], data["history"]["id"])
    assert record.kind == "perplexity" and record.results[0].test == "ppl"
    assert record.results[0].value == pytest.approx(data["ppl"])
    assert "Venus" in record.device, record.device  # from llama-perplexity's own log: it ran on the Venus device


def test_guest_without_gpu_has_no_dri_reads_model_and_propagates_exit_status(image: None, model: Path) -> None:
    script = (
        'ls /dev/dri; echo "model=$MODEL"; test -s "$MODEL" && echo model-readable; touch "$MODEL" 2>&1; '
        'echo "@@net $(ls /sys/class/net)"; exit 7'
    )
    proc = provision("run", "llama-linux", "--model", str(model), "--timeout", "600", "--", "sh", "-c", script)
    assert proc.returncode == 7, proc.stderr[-2000:]
    assert "/dev/dri" in proc.stderr and "No such file or directory" in proc.stderr
    assert "model=/models/" in proc.stdout
    assert "model-readable" in proc.stdout
    assert "Read-only file system" in proc.stdout
    assert "@@net lo\n" in proc.stdout  # no NIC: loopback only
    argv = (run_dir(proc.stderr) / "qemu.argv").read_text()
    assert f"-sandbox {isolation.SANDBOX_FULL} -nic none" in argv
    assert gone(qemu_pid(proc.stderr))


def run_dir(stderr: str) -> Path:
    m = re.search(r" run=(\S+)", stderr)
    assert m, stderr[-800:]
    return Path(m.group(1))


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def test_gpu_guest_runs_sandboxed_as_a_user_with_no_network_and_a_read_only_root(image: None) -> None:
    assert os.geteuid() == 0, "the Linux route enters its tools chroot as root (CI runs it under sudo)"
    script = (
        'vulkaninfo --summary 2>&1 | grep driverID; echo "@@net $(ls /sys/class/net)"; '
        "(echo x > /krun-probe) 2>&1 || echo root-write-refused; echo @@ready; sleep 30"
    )
    run = ["run", "llama-linux", "--gpu", "--timeout", "900", "--", "sh", "-c", script]
    p = subprocess.Popen(
        [sys.executable, "-m", "provision", *run],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    assert p.stdout is not None and p.stderr is not None
    log = ""
    while "qemu pid=" not in log:  # lines before it (e.g. a leftover stopped) are kept for the messages
        line = p.stderr.readline()
        if not line:
            break
        log += line
    out = ""
    while "@@ready" not in out:
        line = p.stdout.readline()
        if not line:
            break
        out += line
    try:
        qemu = qemu_pid(log)
        # QEMU's GL display is SDL's offscreen driver over EGL: no X server, none started.
        assert "xvfb" not in log
        environ = Path(f"/proc/{qemu}/environ").read_bytes().split(b"\0")
        assert b"SDL_VIDEODRIVER=offscreen" in environ and not [e for e in environ if e.startswith(b"DISPLAY=")]
        owned = {"qemu": qemu}
        # The render server and its workers (virgl_render_server, virgl-N-gpu_render…).
        servers = [c for c in children(qemu) if comm(c).startswith("virgl")]
        assert servers, f"no render server under QEMU {qemu}: {out}"
        owned.update({f"render-server-{c}": c for c in servers})
        for what, pid in owned.items():
            st = status_of(pid)
            uids, gids = st["Uid"].split(), st["Gid"].split()
            assert "0" not in uids and "0" not in gids, f"{what} (pid {pid}) runs as {st['Uid']} / {st['Gid']}"
            assert st["NoNewPrivs"] == "1" and int(st["CapEff"], 16) == 0, (what, st["NoNewPrivs"], st["CapEff"])
    finally:
        rest, err = p.communicate(timeout=600)
    assert p.returncode == 0, log + err[-2000:]
    assert "DRIVER_ID_MESA_VENUS" in out, out
    assert "@@net lo\n" in out
    assert "Read-only file system" in out and "root-write-refused" in out
    argv = (run_dir(log) / "qemu.argv").read_text()
    assert f"-sandbox {isolation.SANDBOX_GPU} -nic none" in argv



def test_timeout_stops_and_reaps_qemu(image: None) -> None:
    start = time.monotonic()
    proc = provision("run", "llama-linux", "--timeout", "20", "--", "sleep", "600")
    assert proc.returncode == 31, proc.stderr[-2000:]
    assert "E021" in proc.stderr
    assert time.monotonic() - start < 300
    assert gone(qemu_pid(proc.stderr))


def test_ctrl_c_stops_and_reaps_qemu(image: None) -> None:
    p = subprocess.Popen(
        [sys.executable, "-m", "provision", "run", "llama-linux", "--", "sleep", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    assert p.stderr is not None
    seen = ""
    deadline = time.monotonic() + 300
    while "qemu pid=" not in seen and time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        seen += line
    pid = qemu_pid(seen)
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    rest = p.communicate(timeout=60)[1]
    assert p.returncode == 130, seen + rest
    assert gone(pid)


@pytest.fixture
def held_slots() -> Iterator[None]:
    held = [slots.try_acquire() for _ in range(slots.slot_count())]
    try:
        assert all(held)
        yield
    finally:
        for s in held:
            if s:
                s.release()


def test_third_gpu_run_waits_for_a_slot_then_fails_cleanly(image: None, held_slots: None) -> None:
    start = time.monotonic()
    proc = provision("run", "llama-linux", "--gpu", "--timeout", "5", "--", "true")
    waited = time.monotonic() - start
    assert proc.returncode == 32, proc.stderr[-2000:]
    assert "E022" in proc.stderr
    assert "qemu pid=" not in proc.stderr
    assert waited >= 5


def test_doctor_finds_the_host_tools_chroot(tools: host_tools.HostTools) -> None:
    env = {k: v for k, v in os.environ.items() if k != host_tools.ENV_VAR}
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "doctor", "--json"], capture_output=True, text=True, env=env
    )
    by_id = {c["id"]: c for c in json.loads(proc.stdout)["data"]["checks"]}
    for cid in ("linux.qemu", "linux.qemu.virtio-gpu-gl", "linux.virglrenderer", "linux.virgl-render-server"):
        assert by_id[cid]["status"] == "ok", by_id[cid]
    assert str(tools.root) in by_id["linux.qemu"]["evidence"]
