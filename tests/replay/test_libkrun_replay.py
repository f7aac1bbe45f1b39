"""libkrun's virglrenderer calls, replayed against the darwin APIR tree built for this host.

With our darwin series the tree runs the APIR route (the Venus capset, VIRGL_ROUTE_VENUS_TO_APIR)
and Venus contexts in the calling process, as krunkit's libkrun needs, and export_blob answers at
creation with the handle type libkrun maps; without the series the same harness fails. The
harness's citations are checked against libkrun v1.19.0's own lines.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "checks"))

from libkrun_replay import build  # noqa: E402

HARNESS = REPO / "checks" / "libkrun-replay" / "replay.c"
LIBKRUN = REPO.parent / "shared" / "upstream" / "libkrun-v1.19.0.tar.xz"


def cache() -> Path:
    from provision.core.paths import cache_dir

    return cache_dir("libkrun-replay")


def by_call(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["call"]: c for c in result["calls"]}


def order(result: dict[str, Any]) -> list[str]:
    return [c["call"] for c in result["calls"]]


# --- the harness says which libkrun line makes each call: those lines make it -------------------


def test_each_virgl_call_of_the_harness_cites_the_libkrun_line_that_makes_it() -> None:
    assert LIBKRUN.is_file(), f"{LIBKRUN} missing: the pinned upstream trees live in ../shared/upstream"
    source = HARNESS.read_text()
    cited = re.findall(r'report\([^;]*?"(virgl_\w+)",\s*"rutabaga virgl_renderer\.rs:([^"]+)"', source, re.S)
    assert len(cited) >= 12, cited
    with tarfile.open(LIBKRUN) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("src/rutabaga_gfx/src/virgl_renderer.rs"))
        handle = tar.extractfile(member)
        assert handle is not None
        lines = handle.read().decode().splitlines()
    for function, where in cited:
        numbers = [int(n) for n in re.findall(r":?(\d+)", where)]
        assert any(function in lines[n - 1] for n in numbers), (
            f"{function}: none of virgl_renderer.rs lines {numbers} calls it: "
            + " | ".join(lines[n - 1].strip() for n in numbers)
        )


# --- the patched tree: in-process contexts, blob handles at creation ------------------------------


@pytest.fixture(scope="module")
def patched() -> build.Build:
    return build.build(build.Variant(), cache())


@pytest.mark.slow
def test_the_apir_route_runs_in_process_with_krunkits_flags(patched: build.Build) -> None:
    result = build.run(patched, "apir")
    assert result["ok"], result
    calls = by_call(result)
    assert "flags 0xc0" in calls["virgl_renderer_init"]["detail"]
    assert "apir_version 1" in calls["capset content"]["detail"]
    # libkrun's order: export right after create, before the map pointer, then the command
    seq = order(result)
    steps = ["virgl_renderer_init", "virgl_renderer_context_create_with_flags",
             "virgl_renderer_resource_create_blob", "virgl_renderer_resource_export_blob",
             "virgl_renderer_resource_get_map_info", "virgl_renderer_resource_get_map_ptr",
             "virgl_renderer_submit_cmd", "virgl_renderer_context_create_fence",
             "write_context_fence (callback)", "virgl_renderer_resource_unref",
             "virgl_renderer_context_destroy", "virgl_renderer_cleanup"]  # fmt: skip
    assert [seq.index(s) for s in steps] == sorted(seq.index(s) for s in steps)
    # on Linux the handle is the shm fd libkrun mmaps, and the map pointer is the same memory
    assert "(shm)" in calls["virgl_renderer_resource_export_blob"]["detail"]
    assert calls["get_map_ptr vs mmap(fd)"]["ok"]
    # the round trip ran in virglrenderer's APIR: its reply in the blob, its log on stderr
    assert "notif 43807" in calls["APIR reply (shared memory)"]["detail"]
    assert "host protocol 0.1" in calls["APIR reply (shared memory)"]["detail"]
    assert "Handshake with the guest library completed" in result["stderr"]


def lavapipe() -> dict[str, str]:
    """The Vulkan driver vkr runs on in CI: Mesa's lavapipe (scripts/setup-debian installs it),
    named alone so another ICD on the machine cannot change the answers."""
    icds = sorted(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json"))
    assert icds, "lavapipe's ICD is missing\nfix: scripts/setup-debian (apt package mesa-vulkan-drivers)"
    return {"VK_ICD_FILENAMES": str(icds[0]), "VK_DRIVER_FILES": str(icds[0])}


def blob_calls(result: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    """The calls about one blob ("reply" or "Venus memory"), by name."""
    return {c["call"]: c for c in result["calls"] if c["detail"].startswith(label + ":")}


@pytest.mark.slow
def test_a_venus_context_runs_in_process(patched: build.Build) -> None:
    # lavapipe exports host-visible memory only as an opaque fd: what export_blob gives on this host
    result = build.run(patched, "venus", memory_handle="opaque", env=lavapipe())
    assert result["ok"], result
    calls = by_call(result)
    assert "capset 4 filled" in calls["virgl_renderer_fill_caps"]["detail"]
    assert "(shm)" in blob_calls(result, "reply")["virgl_renderer_resource_export_blob"]["detail"]
    assert "re-routing NOT enabled" in result["stderr"]


@pytest.mark.slow
def test_a_venus_host_visible_allocation_maps_and_the_gpu_sees_it(patched: build.Build) -> None:
    """A guest's vkAllocateMemory through submit_cmd, a blob of that memory exported at creation and
    mapped by pointer; what the harness writes there a vkCmdCopyBuffer on the device's queue copies,
    and the copy is read back through the same pointer once the ring's context fence retires."""
    result = build.run(patched, "venus", memory_handle="opaque", env=lavapipe())
    assert result["ok"], result
    steps = [c["detail"] for c in result["calls"] if c["call"] == "virgl_renderer_submit_cmd"]
    assert any("vkAllocateMemory of 65536 bytes" in d and d.endswith("VK_SUCCESS") for d in steps), steps
    assert any("vkCmdCopyBuffer" in d and d.endswith("VK_SUCCESS") for d in steps), steps
    memory = blob_calls(result, "Venus memory")
    assert "blob_id 5" in memory["virgl_renderer_resource_create_blob"]["detail"]
    # libkrun's order for this blob too: export at once, then the map pointer
    seq = [c["call"] for c in result["calls"] if c["detail"].startswith("Venus memory:")]
    assert seq[:4] == ["virgl_renderer_resource_create_blob", "virgl_renderer_resource_export_blob",
                       "virgl_renderer_resource_get_map_info", "virgl_renderer_resource_get_map_ptr"]  # fmt: skip
    assert "type 2 (opaque)" in memory["virgl_renderer_resource_export_blob"]["detail"]
    fences = [c["detail"] for c in result["calls"] if c["call"] == "write_context_fence (callback)"]
    assert "ctx 1 ring 1 fence 2 retired" in fences, fences
    copy = by_call(result)["Venus memory (host mapping)"]
    assert copy["ok"] and "map pointer: 0 of 8192 words differ" in copy["detail"], copy


@pytest.fixture(scope="module")
def hosted() -> build.Build:
    """The macOS default (VIRGL_EXPORT_BLOB_HOST_POINTER), built on Linux."""
    return build.build(build.Variant(host_pointer=True), cache())


@pytest.mark.slow
def test_the_macos_handle_answers_at_creation_and_maps_by_pointer(hosted: build.Build) -> None:
    """The first export_blob already gives the Apple type, and the APIR reply is read through
    get_map_ptr alone."""
    result = build.run(hosted, "apir", expect_handle="apple")
    assert result["ok"], result
    calls = by_call(result)
    assert "type 4 (apple)" in calls["virgl_renderer_resource_export_blob"]["detail"]
    assert "mmap(exported fd)" not in calls
    assert "notif 43807" in calls["APIR reply (shared memory)"]["detail"]


@pytest.mark.slow
def test_venus_memory_answers_the_macos_handle_at_creation_and_maps_by_pointer(hosted: build.Build) -> None:
    """Venus host-visible memory as libkrun's macOS resource_map_blob needs it: the Apple type at
    the first export_blob, and the GPU's copy read through get_map_ptr alone."""
    result = build.run(hosted, "venus", expect_handle="apple", memory_handle="apple", env=lavapipe())
    assert result["ok"], result
    memory = blob_calls(result, "Venus memory")
    assert "type 4 (apple)" in memory["virgl_renderer_resource_export_blob"]["detail"]
    assert "mmap(exported fd)" not in memory
    assert "0 of 8192 words differ" in by_call(result)["Venus memory (host mapping)"]["detail"]


@pytest.mark.slow
def test_memory_the_driver_cannot_export_is_handed_over_by_its_map_pointer(hosted: build.Build) -> None:
    """MoltenVK's case: Vulkan memory with no fd to export (lavapipe under a layer that hides its
    external-memory fd extensions). The macOS build hands libkrun the vkMapMemory pointer: the Apple
    type at creation, and the GPU's copy read through get_map_ptr."""
    env = {**lavapipe(), **build.no_external_memory(cache())}
    result = build.run(hosted, "venus", expect_handle="apple", memory_handle="apple", env=env)
    assert result["ok"], result
    assert "mem is not exportable" not in result["stderr"]
    memory = blob_calls(result, "Venus memory")
    assert "type 4 (apple)" in memory["virgl_renderer_resource_export_blob"]["detail"]
    assert "0 of 8192 words differ" in by_call(result)["Venus memory (host mapping)"]["detail"]


@pytest.mark.slow
def test_without_the_macos_handle_memory_the_driver_cannot_export_is_no_blob(patched: build.Build) -> None:
    """The layer is what makes the memory unexportable: the Linux build (fd handles only) then has
    nothing to give, and create_blob refuses, as a Linux VMM would see it."""
    env = {**lavapipe(), **build.no_external_memory(cache())}
    result = build.run(patched, "venus", memory_handle="opaque", env=env)
    assert not result["ok"]
    assert any(c["ok"] and "vkAllocateMemory of 65536 bytes" in c["detail"] for c in result["calls"]), result
    created = blob_calls(result, "Venus memory")["virgl_renderer_resource_create_blob"]
    assert not created["ok"] and "ret -22" in created["detail"]
    assert "mem is not exportable" in result["stderr"]


@pytest.mark.slow
def test_the_harness_compiles_for_a_mac(patched: build.Build, tmp_path: Path) -> None:
    """What checks/macos-apir compiles there (the Venus client included), cross-compiled with zig."""
    out = tmp_path / "replay.o"
    headers = [f"-I{patched.root / 'src' / 'src'}", f"-I{patched.library_dir}"]
    cmd = [sys.executable, "-m", "ziglang", "cc", "-target", "aarch64-macos", "-std=gnu11", "-Wall", "-Werror",
           "-c", "-o", str(out), str(HARNESS), *headers]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_bytes()[:4] == bytes.fromhex("cffaedfe")  # MH_MAGIC_64, little-endian


# --- the same harness on the tree without our series ---------------------------------------------


@pytest.mark.slow
def test_the_tree_without_the_series_fails_the_same_harness() -> None:
    bare = build.build(build.Variant(series=False), cache())
    result = build.run(bare, "apir")
    assert not result["ok"] and result["returncode"] == 1
    calls = by_call(result)
    assert calls["virgl_renderer_init"]["ok"]
    # the capset is advertised but never filled, and no context comes without the render server
    assert not calls["virgl_renderer_fill_caps"]["ok"]
    assert not calls["virgl_renderer_context_create_with_flags"]["ok"]
    assert "virgl_renderer_resource_create_blob" not in calls


@pytest.mark.slow
def test_the_tree_without_the_series_fails_the_venus_allocation() -> None:
    """The same Venus replay: the capset stays empty and no context is made, so the guest's
    allocation, its blob and its mapping never happen."""
    bare = build.build(build.Variant(series=False), cache())
    result = build.run(bare, "venus", memory_handle="opaque", env=lavapipe())
    assert not result["ok"] and result["returncode"] == 1
    calls = by_call(result)
    assert not calls["virgl_renderer_fill_caps"]["ok"]
    assert not calls["virgl_renderer_context_create_with_flags"]["ok"]
    assert "Venus memory (host mapping)" not in calls
    assert not [c for c in result["calls"] if c["detail"].startswith("Venus memory:")]


@pytest.mark.slow
def test_the_harness_refuses_the_apir_route_without_its_environment(patched: build.Build) -> None:
    proc = subprocess.run([str(patched.harness), "apir"], capture_output=True, text=True, env={"PATH": "/usr/bin"})
    assert proc.returncode == 2 and "VIRGL_ROUTE_VENUS_TO_APIR=1" in proc.stderr


# --- the APIR loopback routed through virglrenderer: test-backend-ops on "[virtgpu] CPU" -----------


@pytest.mark.slow
def test_the_llama_op_list_passes_through_a_real_apir_context(patched: build.Build) -> None:
    """The frontend's transport is virglrenderer's public API (checks/libkrun-replay/virtgpu-virgl.cpp):
    blobs of an in-process APIR context on the Venus capset, commands through submit_cmd."""
    from libkrun_replay import ops

    rc, out = ops.one(patched, ["-b", ops.DEVICE, "-o", "ADD"])
    # virglrenderer's APIR did the work: its context, its handshake, its load of the backend library
    assert "APIR context created" in out and "Handshake with the guest library completed" in out, out[-3000:]
    assert "APIR backend library loaded" in out
    assert "not whole dwords" not in out, "a command libkrun would refuse (virgl_renderer.rs:94-96)"
    assert rc == 0, out[-3000:]
    results = ops.run(patched)
    failed = {name: r for name, r in results.items() if not r["ok"]}  # type: ignore[index]
    assert not failed, failed
    assert all(r["ran"] > 0 for r in results.values()), results  # type: ignore[index]
