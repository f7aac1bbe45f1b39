"""Mesa's own Venus driver against a Venus context made in process (darwin/0005, vtest's
--venus-in-process from darwin/0006): sid's venus ICD from the host-tools chroot talks over vtest
to the darwin tree's server, which runs vkr in its own process on lavapipe, as krunkit runs it.

What this shows: a real Venus client lists the device, creates a device and queue, and destroys
them and its instance through an in-process context, exiting by itself. The instance's teardown
waits on a CPU-timeline (ring 0) fence that vkr retires inside virgl_renderer_context_create_fence
when it runs in process, and vtest signals only submits already on its timeline: darwin/0006 puts
the submit there before asking for the fence, without which the probe waits for ever (docs/nix.md).
What it does not show: host-visible memory (vtest hands a mapping to its client as an fd; krunkit
maps the pointer darwin/0002 exports, which the replay harness checks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "checks"))

from libkrun_replay import build  # noqa: E402

from tests.replay.test_libkrun_replay import cache, lavapipe  # noqa: E402

PROBE = REPO / "checks" / "libkrun-replay" / "vkprobe.c"
VENUS_ICD = "/usr/share/vulkan/icd.d/virtio_icd.json"
# The probe exits in well under a second once vtest signals its fences; a hang ends here.
PROBE_DEADLINE_S = 60

pytestmark = [pytest.mark.slow, pytest.mark.root]


@pytest.fixture(scope="module")
def chroot_root() -> Path:
    from provision.hosts.linux.tools import host_tools

    tools = host_tools.locate()
    assert tools is not None and tools.is_chroot, "sid's Mesa venus driver lives in the host-tools chroot\n" \
                                                  "fix: provision host-tools"  # fmt: skip
    assert (tools.root / VENUS_ICD.lstrip("/")).is_file(), f"no venus ICD in {tools.root}"
    return tools.root


@pytest.fixture
def scratch(chroot_root: Path) -> Iterator[Path]:
    """A folder inside the chroot (the client's probe and the vtest socket live there)."""
    where = Path(tempfile.mkdtemp(prefix="krun-vtest-", dir=chroot_root / "tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def probe_in(scratch: Path) -> Path:
    """vkprobe built here against Debian's loader: it runs in the chroot against sid's (the ABI is the same)."""
    out = scratch / "vkprobe"
    cmd = ["cc", "-std=gnu11", "-Wall", "-Werror", "-o", str(out), str(PROBE), "-lvulkan"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + "\nfix: scripts/setup-debian (libvulkan-dev)"
    return out


class Served(NamedTuple):
    said: str  # the probe's output
    log: str  # the server's
    probe_rc: int | None  # None: the probe was still running at its deadline and was stopped
    server_rc: int | None  # set only when the server ended by itself


def serve_and_probe(server: Path, flag: str, chroot_root: Path, scratch: Path) -> Served:
    """The server with ``flag`` on lavapipe, the probe over its socket, given PROBE_DEADLINE_S to
    exit by itself."""
    sock = scratch / "vtest.sock"
    env = {**os.environ, **lavapipe()}
    log = scratch / "server.log"
    with log.open("wb") as out:
        srv = subprocess.Popen([str(server), flag, "--no-virgl", "--socket-path", str(sock)], env=env,
                               stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and srv.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if srv.poll() is not None:
            return Served("", log.read_text(errors="replace"), None, srv.returncode)
        inside = "/" + str(scratch.relative_to(chroot_root))
        client_env = ["env", "-i", "PATH=/usr/bin:/bin", "VN_DEBUG=vtest", f"VTEST_SOCKET_NAME={inside}/vtest.sock",
                      f"VK_DRIVER_FILES={VENUS_ICD}", f"VK_ICD_FILENAMES={VENUS_ICD}"]  # fmt: skip
        probe = probe_in(scratch)
        try:
            client = subprocess.run(["chroot", str(chroot_root), *client_env, f"{inside}/{probe.name}"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    timeout=PROBE_DEADLINE_S)  # fmt: skip
        except subprocess.TimeoutExpired as stopped:
            said = stopped.stdout or b""
            return Served(said.decode(errors="replace"), log.read_text(errors="replace"), None, None)
        return Served(client.stdout.decode(errors="replace"), log.read_text(errors="replace"), client.returncode,
                      None)  # fmt: skip
    finally:
        srv.kill()
        srv.wait(timeout=10)


def test_mesas_venus_driver_lists_creates_and_destroys_the_device_through_an_in_process_context(
    chroot_root: Path, scratch: Path
) -> None:
    patched = build.build(build.Variant(), cache())
    run = serve_and_probe(patched.root / "build" / "vtest" / "virgl_test_server", "--venus-in-process",
                          chroot_root, scratch)  # fmt: skip
    assert run.server_rc is None, run.log
    assert "device 0: Virtio-GPU Venus (llvmpipe" in run.said, run
    assert "device created, queue idle" in run.said, run
    # the teardown too: vkDestroyInstance returns (its ring's destroy waits on a ring-0 fence) and the probe exits 0
    assert run.probe_rc == 0, run
    assert "device and instance destroyed" in run.said, run
    # in process: no render server was asked for, so none ran
    assert "render server" not in run.log.lower(), run.log


def test_the_tree_without_the_series_has_no_in_process_mode(chroot_root: Path, scratch: Path) -> None:
    bare = build.build(build.Variant(series=False), cache())
    run = serve_and_probe(bare.root / "build" / "vtest" / "virgl_test_server", "--venus-in-process",
                          chroot_root, scratch)  # fmt: skip
    assert run.server_rc is not None and run.server_rc != 0 and run.said == "", run.log
    assert "--venus]" in run.log or "Usage" in run.log or "usage" in run.log, run.log
