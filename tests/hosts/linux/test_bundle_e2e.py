"""The host-tools bundle really used: made from the sid chroot, installed into a clean
directory, and a GPU guest booted from it (QEMU under TCG, Venus on the bundle's lavapipe)
with an empty PATH, so neither the chroot, nor podman, nor a host program can stand in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from provision.core import catalog
from provision.hosts.linux import backend as linux
from provision.hosts.linux import bundle
from provision.hosts.linux import tools as host_tools
from tests.helpers import run_provision

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    host_tools.make()
    linux.backend().root_disk(catalog.load().get("llama-linux"))
    out = tmp_path_factory.mktemp("bundle") / "host-tools.tar.zst"
    proc = run_provision("host-tools", "--bundle", str(out), "--json", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["data"]["bytes"] == out.stat().st_size
    return out


def test_bundle_installs_into_a_clean_directory_and_runs_a_venus_guest_without_the_chroot(
    archive: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "tools"
    proc = run_provision("host-tools", "--from", str(archive), "--to", str(dest), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    report = json.loads(proc.stdout)["data"]
    assert {c["id"]: c["status"] for c in report["checks"]}["host-tools.qemu-gpu"] == "ok"
    # The glibc inside is the chroot's (newer than most hosts'): the bundle carries its loader.
    assert (dest / bundle.LIB / bundle.LOADER).is_file()
    assert bundle.guest(dest) is not None
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = {"PATH": str(empty), host_tools.ENV_VAR: str(dest)}
    run = run_provision(
        "run", "llama-linux", "--gpu", "--timeout", "1100", "--", "vulkaninfo", "--summary", timeout=1500, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "driverID           = DRIVER_ID_MESA_VENUS" in run.stdout
    assert re.search(r"deviceName\s+= Virtio-GPU Venus \(llvmpipe", run.stdout), run.stdout[-2000:]
    run_dir = Path(re.search(r"run=(\S+)", run.stderr).group(1))  # type: ignore[union-attr]
    argv = (run_dir / "qemu.argv").read_text()
    assert str(dest / bundle.GUEST_DIR) in argv  # the bundle's guest disk, not one made with podman
