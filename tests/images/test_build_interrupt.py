"""A real podman build stopped by SIGINT or SIGTERM mid-step leaves no buildah working container and no
mount behind (podman alone leaves each stage's container mounted in its storage)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from provision.adapters import podman
from provision.images import build as images

pytestmark = [pytest.mark.slow, pytest.mark.podman]

# The child: provision's own signal handling, then one build through the adapter.
CHILD = """
import sys
from pathlib import Path
from provision.adapters import podman, signals
from provision.images import build as images
signals.stop_on_signals()
try:
    podman.build(Path(sys.argv[1]), sys.argv[2], images.host_flags(), log=lambda line: print(line, flush=True))
except KeyboardInterrupt as e:
    print("interrupted", flush=True)
    sys.exit(signals.exit_status(e))
"""


def storage_layers() -> dict[str, str]:
    """Container id -> its layer id, read from podman's storage (buildah's containers included)."""
    root = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    listing = Path(root) / "overlay-containers" / "containers.json"
    return {c["id"]: c["layer"] for c in json.loads(listing.read_text())} if listing.exists() else {}


def mounted_layers() -> str:
    return Path("/proc/self/mountinfo").read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_leaves_no_working_container_or_mount(tmp_path, busybox_image, sig):
    token = uuid.uuid4().hex
    (tmp_path / "Containerfile").write_text(
        f"FROM {busybox_image}\nRUN echo {token} > /first\nRUN echo running-{token}; sleep 300\n"
    )
    before = set(storage_layers())
    tag = f"localhost/krun-gpu-test/interrupted:{token[:12]}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), tag], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    seen: list[str] = []
    assert child.stdout is not None
    deadline = time.monotonic() + 240
    for line in child.stdout:
        seen.append(line.rstrip())
        # the RUN's own output: the step is running, in a mounted working container
        if line.strip() == f"running-{token}" or time.monotonic() > deadline:
            break
    assert seen and seen[-1] == f"running-{token}", "\n".join(seen[-30:])
    during = {cid: layer for cid, layer in storage_layers().items() if cid not in before}
    assert during, "the running build has no working container of its own: nothing would be tested"
    assert any(f"/{layer}/merged" in mounted_layers() for layer in during.values())

    child.send_signal(sig)
    rest, _ = child.communicate(timeout=120)
    assert child.returncode == 128 + sig, rest
    assert "interrupted" in rest
    left = {cid: layer for cid, layer in storage_layers().items() if cid in during}
    assert not left, f"working containers left: {left}\n{rest}"
    mounts = mounted_layers()
    assert not [layer for layer in during.values() if f"/{layer}/" in mounts]
    names = podman.external_containers(podman.BuildFlags(None, None, ()))
    assert not set(names) & set(during)
    assert not podman.exists(tag)


def test_only_this_builds_new_containers_count_as_its_leftovers():
    trace = podman.BuildTrace({})
    for at, line in ((100, "STEP 1/3: FROM localhost/krun-gpu-test/busybox:1_1.35 AS build"),
                     (101, "--> Using cache 2c236b29131b0f"), (102, "--> 402697f6c84"),
                     (103, "[2/2] STEP 1/2: FROM build"), (104, "--> 402697f6c84")):  # fmt: skip
        trace.see(line, now=at)
    assert trace.stems == {"busybox": 100, "2c236b29131b": 101, "402697f6c84": 102, "build": 103}
    now = {"a1": ("busybox-working-container", 100), "a2": ("402697f6c84f-working-container-1", 103),
           "a3": ("2c236b29131b-working-container", 102), "a4": ("ffffffffffff-working-container", 100),
           "a5": ("busybox-working-container-2", 90), "a6": ("my-app", 100),
           "a7": ("busybox-working-container-3", 500)}  # fmt: skip
    # a5 was there before the build started (another build's); a4 and a6 are not named after this
    # build; a7 carries its base's name but was made long after that name appeared: another build's
    assert podman.leftovers({"a5"}, now, trace) == ["a1", "a2", "a3"]


def test_the_next_build_removes_what_a_sigkilled_build_left(tmp_path, busybox_image):
    """SIGKILL leaves provision no way out: its working containers stay until the next build."""
    from provision.adapters import procs

    token = uuid.uuid4().hex
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "Containerfile").write_text(f"FROM {busybox_image}\nRUN echo running-{token}; sleep 300\n")
    before = set(storage_layers())
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(killed), f"localhost/krun-gpu-test/killed:{token[:12]}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == f"running-{token}":
            break
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30  # the reaper stops the orphaned podman build
    while time.monotonic() < deadline and any(
        r.owner == child.pid and r.alive() for d in procs.record_dirs() for r in procs.records(d)
    ):
        time.sleep(0.5)
    left = {cid: layer for cid, layer in storage_layers().items() if cid not in before}
    assert left, "the killed build left nothing: nothing would be tested"

    nxt = tmp_path / "next"
    nxt.mkdir()
    (nxt / "Containerfile").write_text(f"FROM {busybox_image}\nRUN echo {token} > /next\n")
    said: list[str] = []
    tag = f"localhost/krun-gpu-test/next:{token[:12]}"
    try:
        podman.build(nxt, tag, images.host_flags(), log=said.append)
    finally:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True)
    assert not set(storage_layers()) & set(left), said
    mounts = mounted_layers()
    assert not [layer for layer in left.values() if f"/{layer}/" in mounts]
    assert any("removed" in line and "working container" in line for line in said), said
