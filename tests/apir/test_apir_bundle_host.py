"""The APIR route from a host-tools bundle made with --apir, on a host that brings its own ggml
(PROVISION_APIR_HOST_GGML: the lent H200's CUDA build): QEMU's environment names the bundle's
virglrenderer and that ggml by host paths, never the chroot's /opt paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.core.errors import HostToolsMissing
from provision.hosts.linux.apir import host_side
from provision.hosts.linux.tools import bundle, bundle_archive, host_tools


def installed_bundle(root: Path) -> host_tools.HostTools:
    for rel in bundle.APIR_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    (root / bundle_archive.MANIFEST).write_text(json.dumps({"format": bundle_archive.FORMAT, "apir": True}))
    return host_tools.HostTools(root, "bundle", bundle=True)


def test_a_bundle_with_apir_and_a_cuda_build_gives_qemu_host_paths(tmp_path: Path, monkeypatch) -> None:
    tools = installed_bundle(tmp_path / "tools")
    ggml = tmp_path / "cuda-bin"
    ggml.mkdir()
    for name in ("libggml-virtgpu-backend.so", "libggml-cuda.so"):
        (ggml / name).write_bytes(b"")
    monkeypatch.setenv(host_side.HOST_GGML_ENV, str(ggml))
    found = host_side.locate(tools)
    assert found is not None
    env = found.qemu_env()
    assert env["LD_LIBRARY_PATH"] == f"{tools.root}/opt/virgl-apir/lib"
    assert env["RENDER_SERVER_EXEC_PATH"] == f"{tools.root}/opt/virgl-apir/libexec/virgl_render_server"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"] == f"{ggml}/libggml-cuda.so"
    assert env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"] == "ggml_backend_cuda_reg"
    assert env["VIRGL_APIR_BACKEND_LIBRARY"] == f"{ggml}/libggml-virtgpu-backend.so"
    assert {c.id: c.status for c in host_side.checks(tools)}["host-tools.apir.ggml"] == "ok"


def test_without_the_host_ggml_a_bundle_has_no_apir_and_a_wrong_dir_is_named(tmp_path: Path, monkeypatch) -> None:
    tools = installed_bundle(tmp_path / "tools")
    monkeypatch.delenv(host_side.HOST_GGML_ENV, raising=False)
    assert host_side.locate(tools) is None
    monkeypatch.setenv(host_side.HOST_GGML_ENV, str(tmp_path))
    with pytest.raises(HostToolsMissing) as err:
        host_side.locate(tools)
    assert host_side.HOST_GGML_ENV in err.value.message and err.value.code == "E020"
