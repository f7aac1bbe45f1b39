"""`provision serve` and `provision shell` really executed: QEMU (TCG here) + Venus on the
host's lavapipe, the llama-linux image, the tiny-llama model.

Boots are the cost (a TCG boot is about a minute idle, more on a busy host), so there are three:
a foreground CPU serve (its greedy text is the CPU reference, then SIGINT ends it), one detached
GPU serve that every served assertion shares (models, greedy text, four concurrent requests, ps,
the bound address, then stop), and one shell driven through a pty. Traffic goes to 127.0.0.1 only.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from provision.core import paths
from provision.hosts.linux.run import render_workers
from provision.models import store as models

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]

PROMPT = "t1 t2 t3"
BOOT_S = 900  # a generous bound for boot + model load under TCG on a loaded host


def provision(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provision", *args], capture_output=True, text=True, errors="replace", timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post(port: int, path: str, body: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode(errors="replace")
        assert resp.status == 200, f"{path}: {resp.status} {data[:500]}"
        return dict(json.loads(data))
    finally:
        conn.close()


def get(port: int, path: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        assert resp.status == 200, resp.status
        return dict(json.loads(resp.read()))
    finally:
        conn.close()


def greedy(port: int) -> str:
    body = {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "seed": 1}
    return str(post(port, "/v1/completions", body)["choices"][0]["text"])


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def left_running(pids: dict[int, str], grace_s: float = 15.0) -> list[str]:
    """Which of ``pids`` still run after a short grace (the reaper ends just after provision)."""
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [f"{pid} {name}" for pid, name in pids.items() if alive(pid)]


def listeners(port: int) -> list[tuple[str, str]]:
    """(file, local address in hex) of every listening TCP socket on ``port`` (from /proc/net)."""
    found = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:
                found.append((name, addr))
    return found


@pytest.fixture(scope="module")
def model() -> Path:
    return models.ensure("tiny-llama")


@pytest.fixture(scope="module")
def cpu_serve(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A foreground CPU serve: its greedy text, then Ctrl-C (SIGINT) and what was left."""
    port = free_port()
    logs = tmp_path_factory.mktemp("cpu-serve")
    out, err = logs / "out", logs / "err"
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "provision", "serve", "llama-linux", "--model", "tiny-llama"]
            + ["--port", str(port), "--name", "e2e-cpu"],
            stdout=o,
            stderr=e,
        )
    try:
        deadline = time.monotonic() + BOOT_S
        while "http://" not in out.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        assert out.read_text().strip() == f"http://127.0.0.1:{port}", err.read_text()[-3000:]
        text = greedy(port)
        below = render_workers.descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        status = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {"text": text, "status": status, "below": below, "stderr": err.read_text(), "port": port}


def test_foreground_serve_prints_its_url_streams_the_log_and_sigint_leaves_nothing(cpu_serve: dict[str, Any]) -> None:
    assert cpu_serve["status"] == 130, cpu_serve["stderr"][-2000:]
    assert "srv" in cpu_serve["stderr"] or "server" in cpu_serve["stderr"]  # llama-server's own log lines
    assert any("qemu" in name for name in cpu_serve["below"].values()), cpu_serve["below"]
    assert left_running(cpu_serve["below"]) == []
    assert listeners(cpu_serve["port"]) == []
    assert "e2e-cpu" not in provision("ps").stdout


@pytest.fixture(scope="module")
def served(model: Path) -> Iterator[dict[str, Any]]:
    """One detached GPU serve shared by the assertions below; the last test stops it."""
    port = free_port()
    start = time.monotonic()
    proc = provision(
        "serve", "llama-linux", "--model", "tiny-llama", "--gpu", "--detach", "--port", str(port),
        "--name", "e2e-gpu", "--json", "--temp", "0.3", "--runtime-args=--top-k 7 --min-p 0.01", timeout=BOOT_S + 120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = json.loads(proc.stdout)["data"]
    entry["healthy_after_s"] = time.monotonic() - start
    yield entry
    provision("stop", "e2e-gpu", timeout=180)  # no-op when the stop test already ended it


def test_detached_gpu_serve_is_healthy_and_lists_the_model(served: dict[str, Any]) -> None:
    assert served["status"] == "healthy" and served["gpu"] is True
    assert served["url"] == f"http://127.0.0.1:{served['port']}"
    assert get(served["port"], "/health").get("status") == "ok"
    ids = [m["id"] for m in get(served["port"], "/v1/models")["data"]]
    assert ids == ["tiny-llama"]
    # the README's curl
    chat = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}
    reply = post(served["port"], "/v1/chat/completions", chat)
    assert reply["choices"][0]["message"]["role"] == "assistant"


def test_served_greedy_text_on_the_gpu_equals_the_cpu_route(served: dict[str, Any], cpu_serve: dict[str, Any]) -> None:
    gpu_text = greedy(served["port"])
    assert len(gpu_text) > 4
    assert gpu_text == cpu_serve["text"]
    # On Venus for real: the server was told the device (llama-server refuses an unknown one rather
    # than fall back), it did not warn about a missing GPU, and QEMU runs a render server for it.
    job = (Path(served["run_dir"]) / "job.img").read_bytes().rstrip(b"\0").decode()
    assert "--n-gpu-layers 99 --device Vulkan0" in job, job
    assert "no usable GPU found" not in Path(served["log"]).read_text(errors="replace")
    assert re.search(r"virgl|render", " ".join(render_workers.descendants(served["qemu_pid"]).values()))


def test_serve_s_llama_server_options_reach_the_guest_through_the_supervisor(served: dict[str, Any]) -> None:
    params = get(served["port"], "/props")["default_generation_settings"]["params"]
    assert params["temperature"] == pytest.approx(0.3) and params["top_k"] == 7
    assert params["min_p"] == pytest.approx(0.01)


def test_four_concurrent_requests_all_succeed(served: dict[str, Any]) -> None:
    def one(i: int) -> str:
        body = {"model": "tiny-llama", "prompt": f"t{i} t{i + 1}", "max_tokens": 8, "temperature": 0}
        return str(post(served["port"], "/v1/completions", body)["choices"][0]["text"])

    with ThreadPoolExecutor(max_workers=4) as pool:
        texts = list(pool.map(one, range(4)))
    assert len(texts) == 4 and all(texts)


def test_ps_shows_the_serve(served: dict[str, Any]) -> None:
    listed = {e["name"]: e for e in json.loads(provision("ps", "--json").stdout)["data"]}
    assert listed["e2e-gpu"]["url"] == served["url"] and listed["e2e-gpu"]["pid"] == served["pid"]
    assert "e2e-gpu" in provision("ps").stdout


def test_the_port_listens_on_loopback_only(served: dict[str, Any]) -> None:
    found = listeners(served["port"])
    assert found == [("tcp", "0100007F")], found  # 127.0.0.1, no wildcard, no IPv6


def test_a_second_serve_on_the_same_port_fails_before_booting(served: dict[str, Any]) -> None:
    proc = provision("serve", "llama-linux", "--model", "tiny-llama", "--port", str(served["port"]), timeout=120)
    assert proc.returncode == 37 and "E027" in proc.stderr, proc.stderr[-2000:]
    assert "qemu pid=" not in proc.stderr


def slot_of(pid: int) -> Path:
    for path in paths.cache_dir("gpu-slots").glob("slot-*.lock"):
        if path.read_text().strip() == str(pid):
            return path
    raise AssertionError(f"no GPU slot held by {pid}")


def test_stop_ends_it_and_leaves_no_process_and_a_free_slot(served: dict[str, Any]) -> None:
    below = render_workers.descendants(served["pid"])
    names = " ".join(below.values())
    assert "qemu" in names and "Xvfb" not in names and re.search(r"virgl|render", names), below
    slot = slot_of(served["pid"])
    proc = provision("stop", "e2e-gpu", timeout=180)
    assert proc.returncode == 0 and "e2e-gpu: stopped" in proc.stdout, proc.stderr
    assert not alive(served["pid"])
    assert left_running(below) == []
    assert listeners(served["port"]) == []
    fd = os.open(slot, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Slots are shared by everything on this host: a waiting GPU guest may take it the moment
        # it frees; then its holder (written by whoever locks it) is no longer the supervisor.
        assert slot.read_text().strip() != str(served["pid"])
    finally:
        os.close(fd)
    assert "e2e-gpu" not in provision("ps").stdout


def test_shell_runs_commands_through_a_pty_and_exit_returns(model: Path) -> None:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision", "shell", "llama-linux", "--model", "tiny-llama"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""

    def read_until(pattern: bytes, timeout: float) -> bytes:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while not re.search(pattern, seen) and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert re.search(pattern, seen), seen[-2000:].decode(errors="replace")
        return seen

    try:
        read_until(rb"[#$] (\x1b\[\?2004h)?$", BOOT_S)  # the prompt (readline may enable bracketed paste)
        os.write(master, b'echo "krun-$((6*7)) gpu=$KRUN_GPU model=$MODEL"\r')
        read_until(rb"krun-42 gpu=0 model=/models/tiny-llama\.gguf", 120)
        os.write(master, b"exit 3\r")
        status = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert status == 3, seen[-2000:].decode(errors="replace")
    pid = int(re.search(rb"qemu pid=(\d+)", seen).group(1))  # type: ignore[union-attr]
    assert not alive(pid)
