"""Shared fixtures. Heavy artifacts are cached under the provision cache (keyed by what
they depend on) so reruns are fast; a fresh machine builds them once."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def busybox_image() -> str:
    """A tiny local base image: Debian's busybox-static imported with podman (no registry)."""
    from provision.adapters import podman
    from provision.core import paths

    version = run(["apt-cache", "policy", "busybox-static"]).stdout
    candidate = next(line.split()[-1] for line in version.splitlines() if "Candidate:" in line)
    tag = "localhost/krun-gpu-test/busybox:" + candidate.replace(":", "_").replace("+", "_")
    if podman.exists(tag):
        return tag
    work = paths.cache_dir("test-fixtures", "busybox")
    for deb in work.glob("*.deb"):
        deb.unlink()
    run(["apt-get", "download", f"busybox-static={candidate}"], cwd=work)
    deb = next(work.glob("busybox-static_*.deb"))
    rootfs = work / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    run(["dpkg-deb", "-x", str(deb), str(rootfs)])
    bindir = rootfs / "bin"
    applets = run([str(bindir / "busybox"), "--list"]).stdout.split()
    for applet in applets:
        link = bindir / applet
        if not link.exists():
            os.symlink("busybox", link)
    for d in ("tmp", "etc", "opt"):
        (rootfs / d).mkdir(exist_ok=True)
    podman.import_rootfs(rootfs, tag)
    return tag


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty provision cache for this test (PROVISION_CACHE), so no state leaks between tests."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PROVISION_CACHE", str(root))
    return root


CLONE_NEWNET = 0x40000000


@pytest.fixture
def refused_network() -> Iterator[None]:
    """No network for this test and the programs it starts: the test's thread enters a network
    namespace of its own (only a down ``lo``: every connect and DNS lookup fails at once) and
    goes back to the host's when the test ends. A test that says "without network" then holds
    whether or not this machine can reach anything. Namespaces need root (marker: root)."""
    import ctypes

    if os.geteuid() != 0:
        pytest.fail("a network namespace of the test's own needs root (marker: root)")
    libc = ctypes.CDLL(None, use_errno=True)
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            pytest.fail(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(host, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the host's network namespace")
    finally:
        os.close(host)
