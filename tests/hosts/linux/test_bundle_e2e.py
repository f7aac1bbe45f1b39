"""The host-tools bundle really used: made from the sid chroot, installed into a clean
directory, and a GPU guest booted from it (QEMU under TCG, Venus on the bundle's lavapipe)
with an empty PATH, so neither the chroot, nor podman, nor a host program can stand in."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from provision.core import catalog
from provision.hosts.linux.run import facts as linux
from provision.hosts.linux.tools import bundle, bundle_archive, host_tools
from tests.helpers import run_provision

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    host_tools.make()
    linux.root_disk(catalog.load().get("llama-linux"))
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


# Mesa's software drivers and what they pull in; an X server is no part of any bundle now.
NOT_IN_A_HOST_DRIVER_BUNDLE = re.compile(
    r"(libLLVM|libgallium|libz3|libvulkan_lvp|libEGL_mesa|libGLX_mesa|/dri/|Xvfb|xkbcomp|lvp_icd|50_mesa)"
)


def test_host_driver_bundle_leaves_mesa_out_installs_into_a_clean_directory_and_prints_its_size(
    tmp_path: Path,
) -> None:
    host_tools.make()
    out = tmp_path / "gpu-host.tar.xz"
    made = run_provision("host-tools", "--bundle", str(out), "--host-driver", "--no-guest", timeout=1800)
    assert made.returncode == 0, made.stderr[-3000:]
    assert f"bytes: {out.stat().st_size}" in made.stdout.splitlines()
    # It travels with a guest in one 64 MiB transfer to a GPU machine.
    assert out.stat().st_size < 40 * 2**20, out.stat().st_size
    dest = tmp_path / "clean" / "tools"
    proc = run_provision("host-tools", "--from", str(out), "--to", str(dest), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    files = [p for p in dest.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert f"installed_bytes: {size}" in proc.stdout.splitlines(), proc.stdout[-2000:]
    assert 20 * 2**20 < size < 160 * 2**20, size
    rel = [str(p.relative_to(dest)) for p in files]
    assert not [r for r in rel if NOT_IN_A_HOST_DRIVER_BUNDLE.search(r)]
    # The loaders stay: they find the host's own driver.
    assert {f"{bundle.LIB}/libEGL.so.1", f"{bundle.LIB}/libvulkan.so.1", f"{bundle.LIB}/libSDL3.so.0"} <= set(rel)
    assert json.loads((dest / bundle_archive.MANIFEST).read_text())["host_driver"] is True
    empty = tmp_path / "empty-path"
    empty.mkdir()
    version = subprocess.run(
        [str(dest / "usr/bin/qemu-system-x86_64"), "-version"], capture_output=True, text=True, timeout=60,
        env={"PATH": str(empty)},
    )
    assert version.returncode == 0 and "QEMU emulator version 11." in version.stdout, version.stderr[-2000:]
