"""Half-done steps heal: what a killed host-tools, VM-disk export or image build leaves is found by
the next command and removed (or resumed), never used as if whole; nothing of the killed command runs on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision.adapters import partials, podman, procs
from provision.hosts.linux.tools import host_tools
from provision.images import build as images
from provision.images import disks as vmdisk
from tests.images.test_image_build import smoke_catalog


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(host_tools.ENV_VAR, raising=False)
    return tmp_path / "cache"


def test_mountinfo_parsing_finds_mounts_below_deepest_first() -> None:
    info = (
        "36 35 98:0 / /mnt/a rw - ext4 /dev/x rw\n"
        "37 36 0:5 / /mnt/a/b\\040c/proc rw - proc proc rw\n"
        "38 36 0:6 / /mnt/ab rw - tmpfs t rw\n"
    )
    assert partials.mounts_below(Path("/mnt/a"), info) == [Path("/mnt/a/b c/proc"), Path("/mnt/a")]


@pytest.mark.root
def test_a_leftover_with_a_mount_inside_is_unmounted_then_removed(tmp_path: Path) -> None:
    leftover = tmp_path / "tree.partial"
    (leftover / "proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(leftover / "proc")], check=True)
    (leftover / "proc" / "file").write_text("x")
    partials.remove(leftover)
    assert not leftover.exists()
    assert partials.mounts_below(tmp_path) == []


def not_the_cache(tools: host_tools.HostTools | None) -> bool:
    return tools is None or tools.source == "host"


def fake_tools(root: Path) -> None:
    (root / "usr/bin").mkdir(parents=True)
    (root / host_tools.READY_STAMP).write_text("{}")


@pytest.mark.root
def test_host_tools_never_uses_a_half_made_tree_and_the_next_make_removes_it(cache: Path) -> None:
    final = host_tools.cached_root()
    building = final.with_name(final.name + ".building")
    (building / "proc").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", str(building / "proc")], check=True)
    # What a host-tools killed in apt leaves: a debootstrapped tree, no stamp, maybe still mounted.
    assert not_the_cache(host_tools.locate())
    final.mkdir(parents=True)  # a final without its stamp (killed while being replaced) is not whole either
    assert not_the_cache(host_tools.locate())
    fake_tools(final.with_name(final.name + ".old"))
    final.rmdir()
    fake_tools(final)
    said: list[str] = []
    made = host_tools.make(log=said.append)
    assert made.root == final
    assert not building.exists() and not final.with_name(final.name + ".old").exists()
    assert partials.mounts_below(cache) == []
    assert any("did not finish" in line for line in said)


KILL_DURING = textwrap.dedent(
    """
    import sys
    from provision.images import disks as vmdisk
    vmdisk.root_disk(sys.argv[1], sys.argv[2])
    """
)


def ours_left(owner: int) -> list[str]:
    """Processes still recorded for ``owner`` in any record directory (jobs and runs)."""
    return [
        f"{r.name} {r.pid}" for d in procs.record_dirs() for r in procs.records(d) if r.owner == owner and r.alive()
    ]


def wait_for(predicate, within: float, step: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


@pytest.mark.podman
@pytest.mark.root
@pytest.mark.slow
def test_vm_disk_export_killed_midway_is_made_again_whole(tmp_path: Path, cache: Path, busybox_image: str) -> None:
    steps = [
        "busybox mkdir -p /boot /opt/filler",
        "busybox touch /boot/vmlinuz-1 /boot/initrd.img-1",
        "busybox dd if=/dev/urandom of=/opt/filler/blob bs=1M count=192",
    ]
    cat = smoke_catalog(tmp_path, steps)
    from provision.core import catalog

    built = images.build(
        "busybox-smoke",
        tag="localhost/krun-gpu-test/busybox-smoke:disk",
        catalog=catalog.load(cat),
        base_image=busybox_image,
        log=lambda _line: None,
    )
    key_dir = cache / "vm-disks"
    p = subprocess.Popen([sys.executable, "-c", KILL_DURING, built.ref, built.image_id], env=dict(os.environ))
    # Kill once the export is under way (its .partial tree exists and holds files).
    assert wait_for(lambda: any(key_dir.glob("*.partial/rootfs.partial/*")) or p.poll() is not None, 120)
    assert p.poll() is None, "the export finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert wait_for(lambda: not ours_left(p.pid), 10), ours_left(p.pid)
    (partial,) = key_dir.glob("*.partial")
    assert not (partial / "disk.json").exists()
    container = podman.export_container_name(partial / "rootfs")
    left = subprocess.run(["podman", "container", "exists", container]).returncode == 0
    disk = vmdisk.root_disk(built.ref, built.image_id)  # the next command: removes the leftover, makes it whole
    assert disk.disk.is_file() and (disk.directory / "disk.json").is_file()
    assert not partial.exists()
    assert subprocess.run(["podman", "container", "exists", container]).returncode != 0
    fsck = subprocess.run(["e2fsck", "-fn", str(disk.disk)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    print(json.dumps({"export_container_left_by_kill": left}))


@pytest.mark.podman
@pytest.mark.root
@pytest.mark.slow
def test_image_build_killed_midway_leaves_no_process_no_tag_and_the_next_build_works(
    tmp_path: Path, cache: Path, busybox_image: str
) -> None:
    cat = smoke_catalog(tmp_path, ["busybox true", "busybox sleep 12"])
    tag = f"localhost/krun-gpu-test/busybox-smoke:killed-{os.getpid()}"
    argv = [sys.executable, "-m", "provision", "image", "build", "busybox-smoke", "--catalog", str(cat)]
    argv += ["--base-image", busybox_image, "--tag", tag]
    p = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert p.stderr is not None
    seen = ""
    while "busybox sleep 12" not in seen:
        line = p.stderr.readline()
        assert line, seen
        seen += line
    time.sleep(1.0)
    builds = [r for d in procs.record_dirs() for r in procs.records(d) if r.owner == p.pid]
    assert [r.name for r in builds] == ["podman-build"]
    p.kill()
    p.wait()
    # The reaper SIGTERMs the build's group and SIGKILLs it 3 s later: podman itself goes at
    # once, a step's program that ignores SIGTERM (a container's pid 1) only at the SIGKILL.
    pgid = builds[0].pgid
    assert wait_for(lambda: not ours_left(p.pid) and not procs.group_members(pgid), 10), (
        ours_left(p.pid), procs.group_members(pgid))
    assert procs.group_members(pgid) == []
    assert not podman.exists(tag)
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert podman.exists(tag)
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)
