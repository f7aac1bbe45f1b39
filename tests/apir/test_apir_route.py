"""The Linux APIR route as data, and the watchdog that turns a dead host worker into a
fast, named failure (tested against real processes that die)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest

from provision.apir import route as apir_route
from provision.core import errors
from provision.hosts.linux.run import render_workers
from provision.hosts.linux.tools import host_tools

PREFIX = apir_route.VirglPrefix(PurePosixPath("/opt/virgl-apir"))
VULKAN = apir_route.HostGgml(
    PurePosixPath("/opt/ggml/lib/libggml-virtgpu-backend.so"),
    PurePosixPath("/opt/ggml/lib/libggml-vulkan.so"),
    "ggml_backend_vk_reg",
)


def test_hypervisor_env_points_qemu_at_our_virglrenderer_and_backend():
    env = apir_route.hypervisor_env(PREFIX, VULKAN, log_dir=PurePosixPath("/var/log/krun"))
    assert env["LD_LIBRARY_PATH"] == "/opt/virgl-apir/lib"
    assert env["RENDER_SERVER_EXEC_PATH"] == "/opt/virgl-apir/libexec/virgl_render_server"
    assert env["VIRGL_ROUTE_VENUS_TO_APIR"] == "1"
    assert env["VIRGL_APIR_BACKEND_LIBRARY"] == "/opt/ggml/lib/libggml-virtgpu-backend.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == "/opt/ggml/lib/libggml-vulkan.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_vk_reg"
    assert env["GGML_VK_VISIBLE_DEVICES"] == "0"
    assert env["VIRGL_APIR_LOG_TO_FILE"] == "/var/log/krun/virgl-apir.log"
    assert "APIR_LLAMA_CPP_LOG_TO_FILE" in env
    assert "VIRGL_APIR_LOG_TO_FILE" not in apir_route.hypervisor_env(PREFIX, VULKAN)


def test_guest_never_asks_for_the_apir_capset():
    env = apir_route.guest_env({"GGML_REMOTING_USE_APIR_CAPSET": "1", "X": "1"})
    assert env == {"X": "1"}


@pytest.mark.parametrize(
    ("lib", "reg"),
    [("/opt/ggml/lib/libggml-cpu.so", "ggml_backend_cpu_reg"), ("/x/libggml-cpu-haswell.so", "ggml_backend_init")],
)
def test_cpu_backend_is_refused_with_the_reason(lib, reg):
    host = apir_route.HostGgml(VULKAN.backend_library, PurePosixPath(lib), reg)
    with pytest.raises(errors.ApirBackendRefused) as exc:
        apir_route.hypervisor_env(PREFIX, host)
    assert "CPU" in exc.value.message and "hide" in exc.value.message
    assert exc.value.fix and "vulkan" in exc.value.fix


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "/src/ggml/src/ggml-vulkan/ggml-vulkan.cpp:5120: GGML_ASSERT(ggml_vk_dim01_contiguous(src0)) failed",
            "ggml-abort",
        ),
        ("ggml_vulkan: Error: Missing op: ADD for bf16 and bf16 to bf16", "ggml-missing-op"),
        ("ggml-virtgpu: failed to initialize the virtgpu APIR capset", "apir-capset"),
        ("render: failed to receive message: Connection reset by peer", "render-ipc"),
        ("[   12.3] Kernel panic - not syncing: Attempted to kill init!", "kernel-panic"),
    ],
)
def test_fatal_lines_are_named(line, kind):
    death = render_workers.classify(line)
    assert death is not None and death.kind == kind
    assert death.error().code == "E023"


def test_ordinary_lines_are_not_fatal():
    for line in ("ggml-virtgpu: Host minor (1) and guest minor (2) version differ", "llama-bench: pp16 932 t/s"):
        assert render_workers.classify(line) is None


STANDIN = Path(__file__).with_name("qemu_standin.py")


@pytest.fixture(scope="module")
def render_server() -> list[str]:
    """The pinned virgl_render_server from the host tools, as an argv (the chroot needs root)."""
    if os.geteuid() != 0:
        pytest.fail("the real render server runs in the host-tools chroot, which needs root (marker: root)")
    tools = host_tools.make()
    return tools.wrap(["/" + host_tools.RENDER_SERVER])


class Qemu:
    """The stand-in QEMU (qemu_standin.py) holding render contexts on a real render server."""

    def __init__(self, server: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), *server], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def say(self, command: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().startswith("ready"), f"the stand-in QEMU failed at {command!r}"

    def workers(self) -> dict[int, str]:
        below = render_workers.tree(self.proc.pid)
        servers = {p for p, (_parent, name) in below.items() if render_workers.RENDER_SERVER.match(name)}
        return {p: n for p, (parent, n) in below.items()
                if parent in servers and render_workers.zombie_status(p) is None}

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def qemu(render_server: list[str]):
    """A stand-in QEMU holding contexts on the real render server; stopped after the test."""
    stand_in = Qemu(render_server)
    yield stand_in
    stand_in.close()


def _until(what, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _context_of(watch: render_workers.WorkerWatch, worker: int):
    return next((c for c in watch.contexts.values() if c.owner == worker and c.counted), None)


def _paired(watch: render_workers.WorkerWatch, worker: int) -> bool:
    return watch.poll(time.monotonic()) is None and _context_of(watch, worker) is not None


def _watched_worker(qemu: Qemu) -> tuple[render_workers.WorkerWatch, int]:
    qemu.say("open")
    worker = next(iter(_until(qemu.workers)))
    watch = render_workers.WorkerWatch(qemu.proc.pid, confirm_s=1.0)
    # The watch paired the worker with the socket QEMU holds: what it judges the end by.
    _until(lambda: _paired(watch, worker))
    assert watch.workers[worker].startswith("virgl-1-")
    return watch, worker


@pytest.mark.root
def test_a_worker_whose_guest_closed_its_context_is_not_a_death(qemu):
    watch, worker = _watched_worker(qemu)
    qemu.say("close")  # the guest program ended: the worker exits (255) or the server kills it
    _until(lambda: worker not in qemu.workers())
    now = time.monotonic()
    for later in (now, now + 1.5, now + 60.0, now + 3600.0):  # silent far past any grace
        assert watch.poll(later) is None
    assert not [c for c in watch.contexts.values() if c.counted]  # left: the server's own channel
    assert watch.counts["workers_seen"] == watch.counts["contexts"] == watch.counts["closed"] == 1


@pytest.mark.root
@pytest.mark.root
def test_a_worker_ends_with_status_255_when_its_context_closes_so_status_cannot_tell(qemu):
    # The fact the watch is built on, read off the real binary: with the server stopped (it can
    # neither reap nor kill), a worker whose context QEMU closed stays a zombie with its status.
    # The server is stopped only once the worker holds QEMU's socket: a worker forked but not yet
    # handed its context would wait for the stopped server for ever (seen on a loaded machine).
    _watch, worker = _watched_worker(qemu)
    server = render_workers.tree(qemu.proc.pid)[worker][0]
    os.kill(server, signal.SIGSTOP)
    try:
        qemu.proc.stdin.write("close\n")  # type: ignore[union-attr]
        qemu.proc.stdin.flush()  # type: ignore[union-attr]
        # what is asserted is the status, not how soon: a loaded CI box may starve the worker for seconds
        assert _until(lambda: render_workers.zombie_status(worker), timeout=90.0) == "exit status 255"
    finally:
        os.kill(server, signal.SIGCONT)


@pytest.mark.root
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT])
def test_a_worker_killed_with_its_context_open_is_a_death(qemu, sig):
    watch, worker = _watched_worker(qemu)
    os.kill(worker, sig)
    _until(lambda: worker not in qemu.workers())
    now = time.monotonic()
    assert watch.poll(now) is None  # seen ended; confirmed once QEMU still holds it a moment later
    context = _context_of(watch, worker)
    assert context is not None and context.gone_since == now
    death = watch.poll(now + 1.0)
    assert death is not None and death.kind == "render-worker-exit"
    assert f"render worker {worker}" in death.evidence and "context" in death.evidence
    assert death.error().code == "E023"


@pytest.mark.root
def test_a_guest_that_moves_on_to_its_next_program_is_not_a_death(qemu):
    # Several ggml programs one after another: each closes its context, the next opens one.
    watch, first = _watched_worker(qemu)
    qemu.say("close")
    _until(lambda: first not in qemu.workers())
    qemu.say("open")
    second = next(iter(_until(qemu.workers)))
    _until(lambda: _paired(watch, second))
    assert watch.poll(time.monotonic() + 3600.0) is None
    assert _context_of(watch, first) is None and watch.counts["closed"] == 1


@pytest.mark.root
def test_a_worker_that_died_before_the_watch_ever_saw_it_is_still_a_death(qemu):
    # A program whose worker starts and dies between two polls: the kernel still says that the
    # context QEMU holds lost its other end, so the death is caught without the worker seen.
    qemu.say("open")
    worker = next(iter(_until(qemu.workers)))
    os.kill(worker, signal.SIGKILL)
    _until(lambda: worker not in qemu.workers())
    watch = render_workers.WorkerWatch(qemu.proc.pid, confirm_s=1.0)
    now = time.monotonic()
    assert watch.poll(now) is None and worker not in watch.workers
    death = watch.poll(now + 1.0)
    assert death is not None and death.kind == "render-worker-exit" and death.error().code == "E023"
    assert "ended before the watch saw it" in death.evidence


@pytest.mark.root
def test_a_context_opened_and_closed_between_two_polls_is_no_death(qemu):
    watch = render_workers.WorkerWatch(qemu.proc.pid, confirm_s=0.0)
    assert watch.poll(time.monotonic()) is None
    qemu.say("open")
    qemu.say("close")
    now = time.monotonic()
    for later in (now, now + 5.0, now + 3600.0):
        assert watch.poll(later) is None


def test_a_watch_that_cannot_pair_sockets_reports_no_death():
    # Where the kernel refuses sock_diag, a vanished worker cannot be judged: never a false E023.
    def refused() -> dict[int, int]:
        raise PermissionError(13, "sock_diag refused")

    # A server and a worker named as the real ones name themselves (/proc/self/comm).
    tree = (
        "import os, time\n"
        "def named(n): open('/proc/self/comm', 'w').write(n)\n"
        "if os.fork() == 0:\n"
        "    named('virgl_render_se')\n"
        "    if os.fork() == 0: named('virgl-1-gpu_ren'); time.sleep(60)\n"
        "    os.wait()\n"
        "else: os.wait()\n"
    )
    root = subprocess.Popen([sys.executable, "-c", tree])
    try:
        watch = render_workers.WorkerWatch(root.pid, confirm_s=0.0, peers=refused)
        kids = _until(lambda: [p for p, (_, n) in render_workers.tree(root.pid).items() if n == "virgl-1-gpu_ren"])
        watch.poll(0.0)
        assert watch.blind and kids[0] in watch.workers
        os.kill(kids[0], signal.SIGKILL)
        _until(lambda: kids[0] not in render_workers.descendants(root.pid) or render_workers.zombie_status(kids[0]))
        assert watch.poll(10.0) is None and watch.poll(20.0) is None
    finally:
        root.kill()
        root.wait()


def test_walking_the_tree_survives_children_that_exit_while_it_is_read():
    # A root that starts and reaps short-lived children nonstop: a child listed in a
    # `children` file is often gone by the time its own /proc entry is read.
    churn = "import subprocess\nwhile True: subprocess.Popen(['true']).wait()\n"
    root = subprocess.Popen([sys.executable, "-c", churn])
    try:
        seen = 0
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            seen += len(render_workers.descendants(root.pid))
        assert root.poll() is None
        assert seen > 0, "the churn never showed a child: the walk was not exercised"
    finally:
        root.kill()
        root.wait()
