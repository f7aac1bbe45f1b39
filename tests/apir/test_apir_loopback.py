"""The APIR op list through the real frontend and host backend, without a VM (CI's coverage).

The loopback needs no virglrenderer tree and no host-tools chroot with --on-host: it builds the
patched guest frontend and host backend from the pinned sdist against the `host` ggml build
(CPU target), so this runs wherever the suite does.
"""

from __future__ import annotations

import pytest

from provision.apir import ops as apir_ops
from provision.core.errors import InvalidValue
from provision.hosts.linux.apir import loopback as apir_loopback


def test_on_host_build_names_the_pinned_drm_headers_and_quotes_its_paths():
    where = apir_loopback.Where(llama="/s/llama", loopback="/s/loop", patches="/s/p", work="/w w",
                                lib="/l", drm_include="/k/drm inc")
    script = apir_loopback.build_script(["0001-x.patch"], "cpu", where)
    assert "-I'/k/drm inc' " in script
    assert "'/w w/bin'/test-backend-ops" in script
    assert script.count("/w w") == script.count("'/w w")  # every use of the path is quoted
    assert "-DGGML_USE_VULKAN" not in script
    env = apir_loopback.run_env("cpu", where)
    assert env["VIRGL_APIR_BACKEND_LIBRARY"] == "/w w/bin/libggml-virtgpu-backend.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == "/l/libggml-cpu.so"


def test_on_host_refuses_the_vulkan_target():
    with pytest.raises(InvalidValue) as exc:
        apir_loopback.make("vulkan", on_host=True)
    assert "--target vulkan" in exc.value.message and "--target cpu" in exc.value.fix


@pytest.mark.slow
def test_every_llama_op_runs_cases_on_the_remote_device_and_no_host_dies():
    lb = apir_loopback.make("cpu", on_host=True)
    device = apir_loopback.TARGETS["cpu"][2]
    results = apir_loopback.run_ops(lb, device)
    assert list(results) == [op.name for op in apir_ops.LLAMA_OPS]
    for name, r in results.items():
        assert isinstance(r, dict)
        # exit 0: the process (frontend + host backend) did not die; ran > 0: cases really ran
        # on "[virtgpu] CPU", not a skipped device that still prints "backends passed".
        assert r["exit"] == 0 and r["finished"], (name, r)
        assert r["ran"] > 0 and r["ok"], (name, r)
    # Patch 0002 keeps SOFT_MAX with sinks and no mask (a NULL source before a set one) off
    # the remote device; without it those cases would reach the host with guest pointers.
    soft_max = results["SOFT_MAX"]
    assert isinstance(soft_max, dict) and soft_max["unsupported"] > 0
