"""Mesa's own Venus driver against a Venus context made in process (darwin/0005, vtest's
--venus-in-process from darwin/0006): sid's venus ICD from the host-tools chroot talks over vtest
to the darwin tree's server, which runs vkr in its own process on lavapipe, as krunkit runs it.

What this shows: a real Venus client lists the device and creates a device and queue through an
in-process context. What it does not: host-visible memory (vtest hands a mapping to its client as an
fd; krunkit maps the pointer darwin/0002 exports, which the replay harness checks), and the client's
vkDestroyInstance, which waits on the ring for ever after the server has run the destroy (found by
this probe, open: docs/nix.md). So the probe is stopped once it has said what it did.
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

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "checks"))

from libkrun_replay import build  # noqa: E402

from tests.replay.test_libkrun_replay import cache, lavapipe  # noqa: E402

PROBE = REPO / "checks" / "libkrun-replay" / "vkprobe.c"
VENUS_ICD = "/usr/share/vulkan/icd.d/virtio_icd.json"

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


def serve_and_probe(server: Path, flag: str, chroot_root: Path, scratch: Path) -> tuple[str, str, int | None]:
    """The server with ``flag`` on lavapipe, the probe over its socket; the probe's output up to its last line
    (it is stopped 20 s after starting or once it says the queue is idle), the server's log, the server's
    exit status if it ended by itself."""
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
            return "", log.read_text(errors="replace"), srv.returncode
        inside = "/" + str(scratch.relative_to(chroot_root))
        client_env = ["env", "-i", "PATH=/usr/bin:/bin", "VN_DEBUG=vtest", f"VTEST_SOCKET_NAME={inside}/vtest.sock",
                      f"VK_DRIVER_FILES={VENUS_ICD}", f"VK_ICD_FILENAMES={VENUS_ICD}"]  # fmt: skip
        client = subprocess.Popen(["chroot", str(chroot_root), *client_env, f"{inside}/{probe_in(scratch).name}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        assert client.stdout is not None
        os.set_blocking(client.stdout.fileno(), False)
        said = b""
        deadline = time.monotonic() + 20
        while client.poll() is None and b"queue idle" not in said and time.monotonic() < deadline:
            said += client.stdout.read() or b""
            time.sleep(0.1)
        client.kill()
        client.wait(timeout=10)
        said += client.stdout.read() or b""
        return said.decode(errors="replace"), log.read_text(errors="replace"), None
    finally:
        srv.kill()
        srv.wait(timeout=10)


def test_mesas_venus_driver_lists_and_creates_the_device_through_an_in_process_context(
    chroot_root: Path, scratch: Path
) -> None:
    patched = build.build(build.Variant(), cache())
    said, log, ended = serve_and_probe(patched.root / "build" / "vtest" / "virgl_test_server",
                                       "--venus-in-process", chroot_root, scratch)  # fmt: skip
    assert ended is None, log
    assert "device 0: Virtio-GPU Venus (llvmpipe" in said, (said, log)
    assert "device created, queue idle" in said, (said, log)
    # in process: no render server was asked for, so none ran
    assert "render server" not in log.lower(), log


def test_the_tree_without_the_series_has_no_in_process_mode(chroot_root: Path, scratch: Path) -> None:
    bare = build.build(build.Variant(series=False), cache())
    said, log, ended = serve_and_probe(bare.root / "build" / "vtest" / "virgl_test_server", "--venus-in-process",
                                       chroot_root, scratch)  # fmt: skip
    assert ended is not None and ended != 0 and said == "", log
    assert "--venus]" in log or "Usage" in log or "usage" in log, log
