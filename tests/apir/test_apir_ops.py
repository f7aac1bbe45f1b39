"""The llama op list and the reading of test-backend-ops output: cases counted on the device
block only, a skipped device or a cut-off run (a dead host worker) never reads as a pass."""

from __future__ import annotations

import re
from pathlib import Path

from provision.apir import ops as apir_ops
from provision.core import catalog

DEV = "[virtgpu] Vulkan0"
# A real run of the APIR route (checks/linux-apir, 2026-11-30): the whole op list. The log keeps the
# guest's bytes, and the synthetic model generates byte tokens that are not UTF-8.
LOG = Path(__file__).resolve().parents[2] / "bench" / "results" / "linux-apir.log"


def section(name: str) -> str:
    m = re.search(rf"=== {name} start\n(.*?)=== {name} rc=", LOG.read_text(errors="replace"), re.S)
    assert m, name
    return m.group(1)


def test_real_run_counts_cases_on_the_remote_device():
    mm = apir_ops.parse(section("TBO_MUL_MAT"), "MUL_MAT", DEV)
    assert (mm.ran, mm.passed, mm.total) == (16, 16, 16)
    assert mm.unsupported == 0 and mm.finished and mm.device_tested and mm.ok
    add = apir_ops.parse(section("TBO_ADD"), "ADD", DEV)
    assert add.ok and add.ran == add.total == 20
    # Refused cases count apart: patch 0002 keeps sinks-without-mask SOFT_MAX off the device.
    sm = apir_ops.parse(section("TBO_SOFT_MAX"), "SOFT_MAX", DEV)
    assert sm.ok and (sm.ran, sm.unsupported) == (64, 7)


def test_skipped_device_is_not_a_pass():
    # `-b Vulkan0` in the guest names no device: every backend is skipped, yet the run ends
    # with "2/2 backends passed".
    text = (
        "Testing 2 devices\n\nBackend 1/2: [virtgpu] Vulkan0\n  Skipping\nBackend 2/2: CPU\n  Skipping\n"
        "2/2 backends passed\n\x1b[1;32mOK\x1b[0m\n"
    )
    res = apir_ops.parse(text, "GET_ROWS", DEV)
    assert not res.ok and not res.device_tested and res.ran == 0


def test_a_run_cut_off_by_a_dead_worker_is_not_finished():
    text = section("TBO_ADD")
    cut = text[: text.index("  Backend API Remoting backend")]
    cut = cut[: cut.index("tests passed") - 10]
    res = apir_ops.parse(cut, "ADD", DEV)
    assert not res.finished and not res.ok and res.ran > 0


def test_failures_are_listed():
    text = section("TBO_ADD").replace("\x1b[1;32mOK\x1b[0m", "\x1b[1;31mFAIL\x1b[0m", 1)
    res = apir_ops.parse(text, "ADD", DEV)
    assert len(res.failed) == 1 and not res.ok


def test_op_list_covers_the_llama_graph_and_weight_types():
    names = {op.name for op in apir_ops.LLAMA_OPS}
    assert {"GET_ROWS", "RMS_NORM", "MUL", "MUL_MAT", "ROPE", "SOFT_MAX", "ADD", "CPY", "CONT", "SWIGLU",
            "SET_ROWS", "FLASH_ATTN_EXT", "SCALE"} <= names
    for op in ("GET_ROWS", "MUL_MAT"):
        params = apir_ops.by_name()[op].params or ""
        assert all(t in params for t in apir_ops.WEIGHT_TYPES), op
    # Each filter is a valid regex, and the guest command quotes it for sh.
    for op in apir_ops.LLAMA_OPS:
        if op.params:
            re.compile(op.params)
        line = apir_ops.tbo_shell(op)
        assert line.startswith('test-backend-ops test -b "$DEV" -o ' + op.name)


def test_guest_image_builds_the_tools_the_check_runs():
    build = catalog.load().get("llama-apir-linux").build
    assert build is not None
    assert {"test-backend-ops", "llama-simple", "llama-bench"} <= set(build.targets)


def test_loopback_build_applies_the_guest_patches_and_targets_the_chosen_host_backend():
    from provision.hosts.linux.apir import loopback as apir_loopback

    patches = apir_loopback.guest_patches()
    assert patches[0].startswith("0001-") and patches[1].startswith("0002-")
    cpu = apir_loopback.build_script(patches, "cpu")
    assert all(f"/src/patches/{p}" in cpu for p in patches)
    assert "-DGGML_USE_VULKAN" not in cpu and "-lggml-vulkan" not in cpu
    assert "virtgpu-loopback.cpp" in cpu and "repro-supports-op-gap.cpp" in cpu
    vk = apir_loopback.build_script(patches, "vulkan")
    assert "-DGGML_USE_VULKAN" in vk and "-lggml-vulkan" in vk
    env = apir_loopback.run_env("cpu")
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_cpu_reg"
    assert env["VIRGL_APIR_BACKEND_LIBRARY"].endswith("libggml-virtgpu-backend.so")
