"""The Linux APIR guest stack (llama-apir-linux) builds for real from the pinned llama.cpp
source, offline (no venus_hw.h download; every step after the package stages has no network),
with our supports_op patch; its llama-cli reports the pinned build and commit, and its llama-bench
starts and reports that no virtgpu device is present on a host without one."""

from __future__ import annotations

import subprocess

import pytest

from provision.adapters import podman
from provision.apir import preflight
from provision.core import catalog, pins
from provision.images import build as images

pytestmark = [pytest.mark.slow, pytest.mark.podman]


@pytest.fixture(scope="module")
def built() -> images.BuiltImage:
    return images.build("llama-apir-linux")


def test_image_carries_the_route_protocol_and_patch(built):
    labels = podman.labels(built.ref)
    assert labels["krun-gpu.route"] == "apir"
    # the ggml layer's protocol: 0.6 since patches 0022 + 0023, which host libraries built here speak
    assert labels["krun-gpu.apir.protocol"] == preflight.format_protocol(preflight.guest_protocol()) == "0.6"
    assert labels["krun-gpu.patches"] == ",".join(
        ["0001-ggml-virtgpu-ask-the-host-supports-op.patch",
         "0002-ggml-virtgpu-supports-op-only-what-the-host-can-decode.patch",
         "0004-ggml-virtgpu-deterministic-graph-bytes-and-supports-op-cache.patch",
         "0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch",
         "0007-ggml-virtgpu-one-round-trip-per-token.patch",
         "0010-ggml-virtgpu-ask-the-host-alloc-size.patch",
         "0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
         "0012-ggml-virtgpu-outputs-with-the-graph.patch",
         "0014-ggml-virtgpu-run-when-the-outputs-are-wanted.patch",
         "0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch",
         "0016-ggml-virtgpu-send-use-counts.patch",
         "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
         "0023-ggml-virtgpu-send-inputs-by-reference.patch"]
    )
    stack = catalog.load().get("llama-apir-linux")
    assert "GGML_REMOTING_USE_APIR_CAPSET" not in stack.guest_env


@pytest.fixture(scope="module")
def rootfs(built, tmp_path_factory):
    return images.export_rootfs(built.ref, tmp_path_factory.mktemp("apir-linux") / "rootfs")


def test_llama_cli_version_prints_the_pinned_build_and_commit(built, rootfs):
    llama = pins.default().source("llama-cpp")
    proc = subprocess.run(["chroot", str(rootfs), "/usr/local/bin/llama-cli", "--version"],
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # without the pinned -DLLAMA_BUILD_* the .git-less tree says "build 0, commit unknown"
    pinned = f"build {llama['build_number']}, commit {llama['rev'][:9]}"
    assert f"({pinned})" in out, out
    assert podman.labels(built.ref)["krun-gpu.pin.llama-cpp.version"] == pinned


def test_llama_bench_lists_no_virtgpu_device_without_one(built, rootfs):
    for tool in ("llama-cli", "llama-bench", "test-backend-ops", "llama-simple"):
        assert (rootfs / "usr/local/bin" / tool).is_file()
    assert list((rootfs / "boot").glob("vmlinuz-*")) and list((rootfs / "boot").glob("initrd.img-*"))
    proc = subprocess.run(
        ["chroot", str(rootfs), "/usr/local/bin/llama-bench", "--list-devices"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ggml-virtgpu" in out and "failed to open the virtgpu device" in out
    assert "Available devices:" in out and "[virtgpu]" not in out
