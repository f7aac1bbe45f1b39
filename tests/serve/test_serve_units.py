"""serve, ps, stop and shell without a guest: command lines as data, the checks made before any
boot (real sockets, real processes), the state directory, the health probe against a real HTTP
server on 127.0.0.1, and the shell's byte relay on a real pty."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.adapters import qemu
from provision.core import catalog
from provision.core.errors import InvalidValue, PortInUse, RunTimeout, VmFailed
from provision.hosts.darwin.runplan import Publish, plan_run
from provision.hosts.linux.run import shell
from provision.serve import engine as serving
from provision.serve import state as serve_state


def spec(**kw: object) -> qemu.VmSpec:
    base: dict[str, object] = dict(
        kernel="/k",
        initrd="/i",
        root=qemu.Drive("/r.img", "krun-root"),
        drives=(),
        console_log="/c.log",
        stdout_log="/o.log",
        stderr_log="/e.log",
    )
    base.update(kw)
    return qemu.VmSpec(**base)  # type: ignore[arg-type]


def test_a_guest_without_forward_has_no_network_device_at_all() -> None:
    argv = qemu.argv(spec())
    assert not any("netdev" in a or "virtio-net" in a for a in argv)
    assert argv.count("-nic") == 1 and argv[argv.index("-nic") + 1] == "none"  # isolation's explicit default
    assert "-nodefaults" in argv  # no default NIC either


def test_a_forward_is_restricted_user_networking_on_the_given_host_address_only() -> None:
    argv = qemu.argv(spec(forward=qemu.Forward("127.0.0.1", 18080, 8080)))
    i = argv.index("-netdev")
    assert argv[i + 1] == "user,id=net0,restrict=on,ipv6=off,hostfwd=tcp:127.0.0.1:18080-:8080"
    assert argv[i + 2 : i + 4] == ["-device", "virtio-net-pci,netdev=net0"]
    assert "-nic" not in argv  # the forward replaces the `-nic none` default
    with pytest.raises(ValueError):
        qemu.argv(spec(forward=qemu.Forward("localhost,hostfwd=tcp::1-:22", 1, 2)))
    with pytest.raises(ValueError):
        qemu.argv(spec(forward=qemu.Forward("127.0.0.1", 70000, 8080)))


def test_a_terminal_replaces_the_stdout_file_on_ttyS1() -> None:
    argv = qemu.argv(spec(terminal="/dev/pts/7"))
    chardevs = [argv[i + 1] for i, a in enumerate(argv) if a == "-chardev"]
    assert chardevs == ["file,id=con,path=/c.log", "serial,id=out,path=/dev/pts/7", "file,id=err,path=/e.log"]
    with pytest.raises(ValueError):
        qemu.argv(spec(terminal="/dev/pts/7,mux=on"))


def test_guest_init_brings_up_a_nic_only_when_one_is_given() -> None:
    init = (Path(qemu.__file__).parents[1] / "data" / "guest" / "init").read_text()
    assert 'if [ -n "$net" ]; then' in init and "modprobe virtio_net" in init
    assert "10.0.2.15" in init
    subprocess.run(["sh", "-n", "-c", init], check=True)


def test_server_command_offloads_all_layers_to_the_stack_device_or_none() -> None:
    stack = catalog.load().get("llama-linux")
    gpu = serving.server_command(stack, True, "tiny-llama", 512, 4)
    assert gpu[:4] == ["sh", "-c", 'exec llama-server -m "$MODEL" "$@"', "llama-server"]
    assert gpu[4:10] == ["--alias", "tiny-llama", "--host", "0.0.0.0", "--port", "8080"]
    assert " ".join(gpu).endswith("--ctx-size 512 --n-gpu-layers 99 --device Vulkan0")
    assert "--parallel 4" in " ".join(gpu)
    cpu = serving.server_command(stack, False, "tiny-llama", None, 1)
    assert cpu[-4:] == ["--n-gpu-layers", "0", "--device", "none"] and "--ctx-size" not in cpu


def test_host_beyond_loopback_needs_allow_remote_and_must_be_numeric_ipv4() -> None:
    assert serving.check_host("127.0.0.1", False) == "127.0.0.1"
    with pytest.raises(InvalidValue, match="no authentication") as exc:
        serving.check_host("0.0.0.0", False)
    assert exc.value.fix and "--allow-remote" in exc.value.fix
    assert serving.check_host("0.0.0.0", True) == "0.0.0.0"
    for bad in ("localhost", "::1", "127.0.0.1;rm"):
        with pytest.raises(InvalidValue):
            serving.check_host(bad, True)


def test_bad_numbers_and_names_are_refused() -> None:
    for port, ctx, par in ((0, None, 1), (65536, None, 1), (80, 0, 1), (80, None, 0)):
        with pytest.raises(InvalidValue):
            serving.check_numbers(port, ctx, par)
    for bad in ("../x", "A", "", "a" * 64, "a b"):
        with pytest.raises(InvalidValue):
            serve_state.check_name(bad)


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_port_in_use_is_a_clear_error_before_any_guest(listener: int) -> None:
    with pytest.raises(PortInUse):
        serving.check_port_free("127.0.0.1", listener)
    for detach in ([], ["--detach"]):
        proc = subprocess.run(
            [sys.executable, "-m", "provision", "serve", "llama-linux", "--model", "tiny-llama"]
            + ["--port", str(listener), *detach],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 37, proc.stderr
        assert f"E027: cannot publish on 127.0.0.1:{listener}" in proc.stderr
        assert "fix:" in proc.stderr and "Traceback" not in proc.stderr
        assert "qemu pid=" not in proc.stderr


def test_gpu_serve_of_a_stack_without_gpu_is_e007_before_anything() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "serve", "cpu", "--gpu", "--model", "/nonexistent.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 17 and "E007" in proc.stderr, proc.stderr


# --- state ---------------------------------------------------------------------------------------


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path))
    return tmp_path / "serve"


def entry(name: str, pid: int, start: str) -> serve_state.Entry:
    return serve_state.Entry(name, pid, start, "llama-linux", "tiny-llama", True, "127.0.0.1", 18080)


def test_state_claim_refuses_a_live_name_and_replaces_a_dead_one(state: Path) -> None:
    mine = serve_state.own_entry(name="one", stack="llama-linux", model="m", gpu=False, host="127.0.0.1", port=18080)
    serve_state.claim(mine)
    with pytest.raises(InvalidValue, match="already runs"):
        serve_state.claim(mine)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (state / "two.json").write_text(json.dumps(entry("two", dead.pid, "1").as_dict()))
    assert [e.name for e in serve_state.entries()] == ["one"]  # the dead owner's entry is cleaned
    assert not (state / "two.json").exists()
    serve_state.claim(entry("two", os.getpid(), serve_state.process_start(os.getpid()) or ""))
    healthy = serve_state.update(mine, status="healthy", qemu_pid=123)
    assert json.loads((state / "one.json").read_text())["status"] == "healthy"
    assert not list(state.glob(".*tmp"))  # written through a temp name, nothing left over
    serve_state.release(healthy)
    assert [e.name for e in serve_state.entries()] == ["two"]


def test_a_reused_pid_is_not_taken_for_the_owner(state: Path) -> None:
    me = os.getpid()
    state.mkdir(parents=True, exist_ok=True)
    (state / "x.json").write_text(json.dumps(entry("x", me, "1").as_dict()))  # wrong start time
    assert serve_state.entries() == []


def test_stop_sends_sigterm_and_waits_for_the_owner(state: Path) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    e = entry("s", proc.pid, serve_state.process_start(proc.pid) or "")
    serve_state.claim(e)
    assert [x.name for x in serve_state.entries()] == ["s"]
    reaper = threading.Thread(target=proc.wait)
    reaper.start()
    assert serve_state.stop(e, grace_s=20) is True
    reaper.join()
    assert proc.returncode == 0 and serve_state.entries() == []


def test_stop_of_an_unknown_name_says_what_runs(state: Path) -> None:
    with pytest.raises(InvalidValue, match="no serve named 'nope'"):
        serve_state.find("nope")


def test_an_error_crosses_from_the_supervisor_with_its_code() -> None:
    err = serve_state.rebuild_error(PortInUse("busy", fix="other port").as_dict())
    assert isinstance(err, PortInUse) and err.fix == "other port"


# --- health ----------------------------------------------------------------------------------------


class Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self) -> None:  # noqa: N802
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


class FakeGuest:
    """Stands for a booted guest so the waiting logic can be driven (the real one is in the e2e)."""

    def __init__(self, alive: bool = True) -> None:
        self.alive = alive

    def start(self) -> None: ...

    def running(self) -> bool:
        return self.alive

    def booted_at(self) -> float | None:
        return time.monotonic()

    def stop(self) -> None:
        self.alive = False

    def failure(self) -> VmFailed:
        return VmFailed("guest died")

    def details(self) -> dict[str, object]:
        return {}


def request(port: int, wait_s: float = 5) -> serving.ServeRequest:
    stack = catalog.load().get("llama-linux")
    return serving.ServeRequest(stack, Path("/m.gguf"), "m", False, port=port, name="t", wait_s=wait_s)


def test_health_waits_through_503_until_200(health_server: int) -> None:
    Health.answers = [503, 503]
    assert not serving.health("127.0.0.1", health_server)
    serving.wait_healthy(request(health_server), FakeGuest(), poll_s=0.05)
    assert Health.answers == []


def test_health_wait_ends_with_the_guest_failure_or_the_deadline(listener: int) -> None:
    with pytest.raises(VmFailed, match="guest died"):
        serving.wait_healthy(request(listener), FakeGuest(alive=False), poll_s=0.05)
    with pytest.raises(RunTimeout, match="did not answer"):
        serving.wait_healthy(request(listener, wait_s=0.3), FakeGuest(), poll_s=0.05)


# --- macOS plans -------------------------------------------------------------------------------------


def test_macos_serve_publishes_on_loopback_and_shell_is_interactive(tmp_path: Path) -> None:
    stack = catalog.load().get("llama")
    model = tmp_path / "blob"
    serve = plan_run(
        stack,
        gpu=True,
        route=None,
        model_path=model,
        command=["llama-server"],
        compat={},
        image="img",
        publish=Publish("127.0.0.1", 18080, 8080),
        model_name="tiny-llama.gguf",
    )
    argv = list(serve.argv)
    assert argv[argv.index("-p") + 1] == "127.0.0.1:18080:8080"
    assert f"{model}:/models/tiny-llama.gguf:ro" in argv and "MODEL=/models/tiny-llama.gguf" in argv
    assert "-it" not in argv
    run = plan_run(stack, gpu=True, route=None, model_path=None, command=["sh"], compat={}, image="i")
    assert "-p" not in run.argv
    sh = plan_run(stack, gpu=True, route=None, model_path=None, command=["sh"], compat={}, image="i", interactive=True)
    assert sh.argv[:4] == ("podman", "run", "--rm", "-it")


def test_a_split_model_reaches_the_macos_container_part_by_part(tmp_path: Path) -> None:
    names = [f"big-{k:05d}-of-00002.gguf" for k in (1, 2)]
    for name in names:
        (tmp_path / name).write_bytes(b"GGUF")
    req = serving.ServeRequest(catalog.load().get("llama"), tmp_path / names[0], "big", True, name="t")
    name, beside = serving.guest_files(req)
    plan = plan_run(req.stack, gpu=True, route=None, model_path=req.model_path, command=req.command(), compat={},
                    image="img", model_name=name, model_extras=beside)  # fmt: skip
    argv = list(plan.argv)
    for part in names:
        assert f"{tmp_path / part}:/models/{part}:ro" in argv
    assert f"MODEL=/models/{names[0]}" in argv


# --- shell -----------------------------------------------------------------------------------------


def test_shell_command_makes_ttyS1_the_controlling_terminal() -> None:
    cmd = shell.shell_command("xterm-256color", 40, 120)
    assert cmd[:2] == ["sh", "-c"]
    assert cmd[2].startswith("exec </dev/ttyS1 >/dev/ttyS1 2>&1; stty sane rows 40 cols 120;")
    assert "setsid -w -c bash -i" in cmd[2]
    assert "TERM=vt100" in shell.shell_command("x;reboot", 24, 80)[2]


def test_relay_copies_both_ways_and_ctrl_bracket_escapes() -> None:
    master, slave = os.openpty()
    shell.tty.setraw(slave)
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    relay = shell.Relay(master, in_r, out_w)
    relay.start()
    try:
        os.write(in_w, b"echo hi\r")
        assert os.read(slave, 100) == b"echo hi\r"  # what the user types reaches the guest side
        os.write(slave, b"hi\r\n")
        assert os.read(out_r, 100) == b"hi\r\n"  # what the guest writes reaches the user
        os.write(in_w, b"\x1d")
        assert relay.escaped.wait(5)
    finally:
        relay.stop()
        for fd in (master, slave, in_r, in_w, out_r, out_w):
            os.close(fd)


def test_ctrl_bracket_stops_the_latest_qemu_not_an_earlier_boot_s_pid() -> None:
    # A guest whose init never started is booted again: on_start then reports a second QEMU pid.
    first = subprocess.Popen(["sleep", "60"])
    latest = subprocess.Popen(["sleep", "60"])
    relay = shell.Relay(-1, -1, -1)  # never started: only its events are used
    watcher = threading.Thread(target=shell._stop_on_escape, args=(relay, [first.pid, latest.pid]))
    watcher.start()
    try:
        relay.escaped.set()
        watcher.join(10)
        assert latest.wait(10) != 0
        assert first.poll() is None
    finally:
        for p in (first, latest):
            p.kill()
            p.wait()


def test_a_split_model_reaches_the_guest_part_by_part_under_its_own_names(empty_cache: Path, tmp_path: Path) -> None:
    from provision.hosts.linux.run import serve as linux_serve
    from provision.images import disks

    names = [f"big-Q4_K_M-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]
    for k, name in enumerate(names):
        (tmp_path / name).write_bytes(b"GGUF" + bytes([k]) * 100)
    stack = catalog.load().get("llama-linux")
    req = serving.ServeRequest(stack, tmp_path / names[0], "big-Q4_K_M", False, name="t")
    run = linux_serve.run_request(req)  # what the guest run is asked for
    seen = {"model_path": run.model_path, "model_name": run.model_name, "model_extras": dict(run.model_extras)}
    assert seen["model_name"] == names[0] and sorted(seen["model_extras"]) == names[1:]
    disk = disks.model_disk(seen["model_path"], seen["model_name"], seen["model_extras"])
    listing = subprocess.run(["debugfs", "-R", "ls -p /", str(disk)], capture_output=True, text=True, check=True)
    assert all(f"/{name}/" in listing.stdout for name in names), listing.stdout
    # one file keeps the alias, as before
    single = serving.ServeRequest(stack, tmp_path / "x.gguf", "tiny", False, name="t")
    assert serving.guest_files(single) == ("tiny.gguf", {})
    (tmp_path / names[2]).unlink()
    with pytest.raises(InvalidValue, match="is missing"):
        serving.check_parts(tmp_path / names[0])
