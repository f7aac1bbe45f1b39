"""The llama-apir guest recipe built on Debian, offline: frontend + llama-bench from the pinned tree.

The guest build is cached keyed by the pins (about 5 min cold on 2 cores). On a machine with no
virtio-gpu the frontend must say so and llama-bench must still list devices and exit 0.
"""

from __future__ import annotations

import subprocess

import pytest

from provision.apir import builds

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def guest_build() -> builds.Built:
    return builds.ensure("guest")


def test_guest_llama_bench_lists_devices_and_reports_no_virtgpu(guest_build):
    bench = guest_build.library("llama-bench")
    proc = subprocess.run([str(bench), "--list-devices"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Available devices" in out
    assert "ggml-virtgpu" in out and "apir_initialize failed" in out, out
    assert "[virtgpu]" not in proc.stdout


def test_guest_binary_links_the_virtgpu_frontend_and_libdrm(guest_build):
    ldd = subprocess.run(["ldd", str(guest_build.library("libggml-virtgpu.so"))], capture_output=True, text=True,
                         check=True).stdout
    assert "libdrm.so" in ldd and "not found" not in ldd
    assert guest_build.manifest["apir_protocol"] == [0, 2]
