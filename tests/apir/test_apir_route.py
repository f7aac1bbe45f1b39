"""The Linux APIR route as data, and the watchdog that turns a dead host worker into a
fast, named failure (tested against real processes that die)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import PurePosixPath

import pytest

from provision.apir import route as apir_route
from provision.core import errors
from provision.hosts.linux import watchdog

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
    death = watchdog.classify(line)
    assert death is not None and death.kind == kind
    assert death.error().code == "E023"


def test_ordinary_lines_are_not_fatal():
    for line in ("ggml-virtgpu: Host minor (1) and guest minor (2) version differ", "llama-bench: pp16 932 t/s"):
        assert watchdog.classify(line) is None


def _tree_with_worker():
    # A real process tree: bash (the "QEMU") with a child named like a render worker.
    root = subprocess.Popen(["bash", "-c", "exec -a virgl_render_server sleep 60 & wait"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = watchdog.descendants(root.pid)
        if any("sleep" in n or "virgl" in n for n in kids.values()):
            return root, kids
        time.sleep(0.05)
    raise AssertionError("worker did not start")


def test_a_worker_that_dies_without_guest_progress_is_reported():
    root, kids = _tree_with_worker()
    try:
        watch = watchdog.WorkerWatch(root.pid, grace_s=0.5, names=__import__("re").compile("sleep|virgl"))
        assert watch.poll(0.0) is None and watch.seen
        for pid in kids:
            subprocess.run(["kill", "-9", str(pid)], check=True)
        time.sleep(0.2)
        assert watch.poll(1.0) is None  # within the grace period
        death = watch.poll(2.0)
        assert death is not None and death.kind == "render-worker-exit"
        assert str(root.pid) in death.evidence
    finally:
        root.kill()
        root.wait()


def test_a_worker_that_ends_with_guest_progress_is_not_a_death():
    root, kids = _tree_with_worker()
    try:
        watch = watchdog.WorkerWatch(root.pid, grace_s=0.5, names=__import__("re").compile("sleep|virgl"))
        watch.poll(0.0)
        for pid in kids:
            subprocess.run(["kill", "-9", str(pid)], check=True)
        time.sleep(0.2)
        watch.poll(1.0)
        watch.progress()  # the guest printed its next marker: the context simply ended
        assert watch.poll(5.0) is None
    finally:
        root.kill()
        root.wait()


def test_a_new_worker_after_an_exit_means_the_guest_moved_on(tmp_path):
    # Root process (the "QEMU") starts a worker, then a second one when told to: as the render
    # server does when the guest's next program opens its context.
    flag = tmp_path / "next"
    script = (
        "import subprocess, time, pathlib, sys\n"
        "a = subprocess.Popen(['sleep', '60'])\n"
        f"f = pathlib.Path({str(flag)!r})\n"
        "while not f.exists(): a.poll(); time.sleep(0.05)\n"
        "b = subprocess.Popen(['sleep', '61'])\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 5
        while not watchdog.descendants(root.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        watch = watchdog.WorkerWatch(root.pid, grace_s=1.0, names=re.compile("sleep"))
        watch.poll(0.0)
        first = list(watch.seen)
        assert first
        subprocess.run(["kill", "-9", str(first[0])], check=True)
        deadline = time.monotonic() + 20  # until the root has reaped it (a zombie still counts)
        while first[0] in watchdog.descendants(root.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.poll(0.5)
        assert watch.pending is not None
        flag.touch()
        # Wait for the second worker itself (not the first one's zombie), and for it to have
        # exec'd: between fork and exec its name is still the root's, not "sleep".
        def second_worker() -> set[int]:
            return {p for p, n in watchdog.descendants(root.pid).items() if n == "sleep" and p not in first}

        deadline = time.monotonic() + 20
        while not second_worker() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second_worker(), "the second worker never started"
        assert watch.poll(0.7) is None and watch.pending is None
        assert watch.poll(10.0) is None
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
            seen += len(watchdog.descendants(root.pid))
        assert root.poll() is None
        assert seen > 0, "the churn never showed a child: the walk was not exercised"
    finally:
        root.kill()
        root.wait()
