"""Build plans, the pinned source and the APIR protocol it carries."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from provision.apir import builds
from provision.apir import ggml as ggml_build
from provision.apir import preflight as apir
from provision.core import pins
from provision.core.errors import InvalidValue, SourceUnavailable
from provision.images import sources


def _plan(name: str, **kw: object) -> ggml_build.BuildPlan:
    v = ggml_build.variant(name)
    return ggml_build.plan(v, source=Path("/src"), build_dir=Path("/b"), key="k",
                           offline_include=builds.OFFLINE_INCLUDE, **kw)  # type: ignore[arg-type]


def test_every_variant_builds_named_targets_with_the_offline_include():
    for name in ggml_build.VARIANTS:
        extra: dict[str, object] = {}
        if name.startswith("cuda"):
            extra["cuda_architectures"] = "90"
        if name == "guest":
            extra["drm_include_dir"] = Path("/kdrm")
        plan = _plan(name, **extra)
        assert plan.build[-len(ggml_build.VARIANTS[name].targets):] == list(ggml_build.VARIANTS[name].targets)
        assert "all" not in plan.build
        assert f"-DCMAKE_PROJECT_INCLUDE={builds.OFFLINE_INCLUDE}" in plan.configure
        assert "-DGGML_NATIVE=OFF" in plan.configure


def test_host_plan_is_backend_only_and_cuda_plan_keeps_flash_attention():
    assert "-DGGML_VIRTGPU_BACKEND=ONLY" in _plan("host").configure
    cuda = _plan("cuda", cuda_architectures="90")
    assert {"-DGGML_CUDA=ON", "-DGGML_CUDA_FA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"} <= set(cuda.configure)
    assert "ggml-cuda" in cuda.build
    with pytest.raises(InvalidValue):
        _plan("cuda")


def test_cuda_tools_plan_builds_the_cuda_libraries_with_the_same_flags_plus_the_native_tools():
    cuda, tools = _plan("cuda", cuda_architectures="90"), _plan("cuda-tools", cuda_architectures="90")
    ggml_flags = {a for a in cuda.configure if a.startswith(("-DGGML_", "-DCMAKE_CUDA"))}
    assert ggml_flags == {a for a in tools.configure if a.startswith(("-DGGML_", "-DCMAKE_CUDA"))}
    assert {"-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_COMMON=ON"} <= set(tools.configure)
    assert tools.build[-4:] == ["ggml-cuda", "ggml", "llama-bench", "test-backend-ops"]
    assert ggml_build.variant("cuda-tools").ggml_reg == ggml_build.variant("cuda").ggml_reg
    with pytest.raises(InvalidValue):
        _plan("cuda-tools")


def test_guest_plan_builds_the_frontend_and_llama_bench_with_the_new_drm_header():
    guest = _plan("guest", drm_include_dir=Path("/kdrm"))
    assert "-DGGML_VIRTGPU=ON" in guest.configure and not any("BACKEND=ONLY" in a for a in guest.configure)
    assert "-DCMAKE_CXX_FLAGS=-I/kdrm" in guest.configure
    assert guest.build[-2:] == ["ggml-virtgpu", "llama-bench"]
    with pytest.raises(InvalidValue):
        _plan("guest")


def test_cache_key_changes_with_every_input():
    v = ggml_build.variant("cuda")
    base = ggml_build.cache_key(v, source_sha256="a", cuda_architectures="90")
    assert base.startswith("cuda-")
    assert base == ggml_build.cache_key(v, source_sha256="a", cuda_architectures="90")
    assert base != ggml_build.cache_key(v, source_sha256="b", cuda_architectures="90")
    assert base != ggml_build.cache_key(v, source_sha256="a", cuda_architectures="89")


def test_offline_include_neutralizes_the_venus_hw_header_project():
    text = builds.offline_include().read_text()
    assert 'STREQUAL "venus_hw_header"' in text and "venus_hw.h" in text


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(InvalidValue, match="host"):
        ggml_build.variant("metal")


def test_cached_sdist_with_wrong_bytes_is_refused_and_never_used(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path))
    pin = pins.default().source(sources.SDIST_PIN)
    bad = tmp_path / "sources" / str(pin["filename"])
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the sdist")
    with pytest.raises(SourceUnavailable) as exc:
        sources.sdist_path()
    assert exc.value.code == "E042" and str(bad) in exc.value.message and str(pin["size"]) in exc.value.message


def test_pip_download_fetches_the_sdist_only():
    cmd = sources.pip_download_command("llama-cpp-python==0.3.36", Path("/d"))
    assert cmd[1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in cmd and cmd[cmd.index("--no-binary") + 1] == ":all:"


@pytest.mark.slow
def test_pinned_tree_carries_the_pinned_apir_protocol():
    tree = sources.llama_cpp_tree()
    assert not (tree / ".git").exists()
    # The tree as pinned says upstream's 0.2; our series (patches 0006, 0011, 0015, then 0022) makes every build of
    # it 0.6.
    assert sources.apir_protocol(tree) == (0, 2) and apir.guest_protocol() == (0, 6)
    patched = builds.patched_tree(tree, ("0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch",
                                         "0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
                                         "0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch",
                                         "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch"), "test")
    assert sources.apir_protocol(patched) == (0, 6)


def test_protocol_in_a_tree_that_disagrees_with_the_pin_is_refused(tmp_path):
    header = tmp_path / sources.PROTOCOL_HEADER
    header.parent.mkdir(parents=True)
    header.write_text("#define APIR_PROTOCOL_MAJOR 0\n#define APIR_PROTOCOL_MINOR 9\n")
    with pytest.raises(SourceUnavailable, match="apir_protocol"):
        sources.apir_protocol(tmp_path)


def test_protocol_check_warns_on_minor_and_fails_on_major_mismatch():
    assert apir.protocol_check((0, 2), (0, 2)).status == "ok"
    warn = apir.protocol_check((0, 2), (0, 1))
    assert warn.status == "warn" and "0.2" in warn.evidence and "0.1" in warn.evidence
    assert apir.protocol_check((1, 0), (0, 1)).status == "fail"
    # Today's pins: guest llama.cpp 0.6 (our series), host virglrenderer MR 1590 0.1.
    assert apir.protocol_check().status == "warn"
    assert apir.parse_protocol(apir.format_protocol(apir.guest_protocol())) == (0, 6)


def test_protocol_command_prints_the_image_label(capsys):
    from provision.cli import main

    assert main(["apir", "protocol", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["data"]
    assert out["label"] == {"krun-gpu.apir.protocol": "0.6"} and out["check"]["status"] == "warn"


def test_dry_run_prints_the_plan_without_building(capsys):
    from provision.cli import main

    assert main(["ggml", "build", "--variant", "guest", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["data"]
    assert plan["variant"] == "guest" and plan["key"].startswith("guest-")
    assert plan["build"][-2:] == ["ggml-virtgpu", "llama-bench"]
    assert any(a.startswith("-DCMAKE_CXX_FLAGS=-I") and "kdrm-" in a for a in plan["configure"])


@pytest.mark.slow
def test_ggml_build_command_reuses_the_cached_host_build(capsys):
    from provision.cli import main

    assert main(["ggml", "build", "--variant", "host", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["data"]
    bin_dir = Path(out["bin_dir"])
    assert (bin_dir / "libggml-virtgpu-backend.so").exists() and (bin_dir / "libggml-cpu.so").exists()
    # The host build applies the whole series, so it speaks the pinned minor, not the tree's upstream one.
    assert tuple(out["manifest"]["apir_protocol"]) == sources.pinned_protocol()
    assert out["manifest"]["targets"] == ["ggml-virtgpu-backend", "ggml-cpu"]
    assert not list(bin_dir.parent.parent.glob(f".{out['key']}-*")), "a staging directory was left behind"


def test_a_failing_configure_is_e043_naming_the_step_and_the_log(tmp_path):
    from provision.adapters import cmake
    from provision.core.errors import BuildFailed

    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        'cmake_minimum_required(VERSION 3.19)\nproject(x NONE)\nmessage(FATAL_ERROR "boom")\n'
    )
    plan = ggml_build.plan(ggml_build.variant("host"), source=src, build_dir=tmp_path / "b", key="k",
                           offline_include=builds.OFFLINE_INCLUDE)
    lines: list[str] = []
    with pytest.raises(BuildFailed) as exc:
        cmake.run(plan, log=tmp_path / "build.log", progress=lines.append)
    assert exc.value.code == "E043" and "step 'configure'" in exc.value.message and "boom" in exc.value.message
    assert str(tmp_path / "build.log") in exc.value.message and "boom" in (tmp_path / "build.log").read_text()
    assert lines and "configure" in lines[0]


def test_missing_build_tool_is_e006_naming_it():
    from provision.adapters import cmake
    from provision.core.errors import ToolMissing

    with pytest.raises(ToolMissing, match="nvcc-that-does-not-exist"):
        cmake.require_tools(("cmake", "nvcc-that-does-not-exist"), variant="cuda")


def test_damaged_cached_sdist_fix_says_which_file_to_delete(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path))
    pin = pins.default().source(sources.SDIST_PIN)
    bad = tmp_path / "sources" / str(pin["filename"])
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"x" * int(pin["size"]))  # right size, wrong bytes: the sha256 check catches it
    with pytest.raises(SourceUnavailable) as exc:
        sources.sdist_path()
    assert str(pin["sha256"]) in exc.value.message and f"delete {bad}" in (exc.value.fix or "")


def _configure(src: Path, build: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *extra],
                          capture_output=True, text=True)


def test_offline_include_builds_a_local_external_project_as_declared(tmp_path):
    # ggml-vulkan builds its shader generator with ExternalProject_Add(SOURCE_DIR ...): no download.
    (tmp_path / "src" / "tool").mkdir(parents=True)
    (tmp_path / "src" / "tool" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\nproject(tool NONE)\n"
        "add_custom_target(tool ALL COMMAND ${CMAKE_COMMAND} -E touch ${CMAKE_BINARY_DIR}/tool-built)\n"
    )
    (tmp_path / "src" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\nproject(outer NONE)\ninclude(ExternalProject)\n"
        "ExternalProject_Add(local_tool SOURCE_DIR ${CMAKE_SOURCE_DIR}/tool BINARY_DIR ${CMAKE_BINARY_DIR}/tool\n"
        '  INSTALL_COMMAND "")\n'
    )
    conf = _configure(tmp_path / "src", tmp_path / "b", f"-DCMAKE_PROJECT_INCLUDE={builds.OFFLINE_INCLUDE}")
    assert conf.returncode == 0, conf.stderr
    build = subprocess.run(["ninja", "-C", str(tmp_path / "b"), "local_tool"], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "b" / "tool" / "tool-built").exists()


@pytest.mark.slow
def test_vulkan_variant_configures_offline_on_this_host(tmp_path):
    plan, _ = builds.plan_for("vulkan", fetch=True)
    configure = [str(tmp_path / "b") if a == str(plan.build_dir) else a for a in plan.configure]
    conf = subprocess.run(configure, capture_output=True, text=True)
    assert conf.returncode == 0, conf.stdout[-2000:] + conf.stderr[-2000:]
    ninja = (tmp_path / "b" / "build.ninja").read_text()
    assert "vulkan-shaders-gen" in ninja and "gitlab" not in ninja


def test_vulkan_headers_without_layer_settings_are_refused_before_building(tmp_path):
    old = tmp_path / "old.h"
    old.write_text("#define VK_HEADER_VERSION 239\n#define VK_EXT_image_2d_view_of_3d 1\n")
    new = tmp_path / "new.h"
    new.write_text("#define VK_HEADER_VERSION 341\n#define VK_EXT_layer_settings 1\n")
    problem = builds.vulkan_headers_problem(old)
    assert problem and "239" in problem and "VK_EXT_layer_settings" in problem
    assert builds.vulkan_headers_problem(new) is None
    assert "libvulkan-dev" in (builds.vulkan_headers_problem(tmp_path / "missing.h") or "")


def test_every_apir_host_variant_carries_our_host_fixes_and_the_guest_none():
    for v in ggml_build.VARIANTS.values():
        # a variant that names a ggml backend for APIR to load is a host side
        assert v.patches == (ggml_build.HOST_PATCHES if v.ggml_library else ()), v.name
    for name in ggml_build.HOST_PATCHES:
        assert (builds.llama_patches() / name).is_file(), name


def _mini_tree(root: Path) -> Path:
    tree = root / "llama.cpp-mini"
    (tree / "ggml").mkdir(parents=True)
    (tree / "ggml" / "a.c").write_text("int a = 1;\n")
    return tree


@pytest.fixture
def patches(tmp_path, monkeypatch) -> Path:
    """An empty patches/llama.cpp of the test's own, and a fresh cache."""
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    where = tmp_path / "patches" / "llama.cpp"
    where.mkdir(parents=True)
    monkeypatch.setattr(builds, "llama_patches", lambda: where)
    return where


def test_a_patched_tree_is_a_cached_copy_keyed_by_the_patches_bytes(tmp_path, patches):
    (patches / "x.patch").write_text("--- a/ggml/a.c\n+++ b/ggml/a.c\n@@ -1 +1 @@\n-int a = 1;\n+int a = 2;\n")
    tree = _mini_tree(tmp_path)
    got = builds.patched_tree(tree, ("x.patch",), "src-1")
    assert (got / "ggml" / "a.c").read_text() == "int a = 2;\n"
    assert (tree / "ggml" / "a.c").read_text() == "int a = 1;\n"  # the pinned tree is never changed
    assert builds.patched_tree(tree, ("x.patch",), "src-1") == got  # cached
    assert not [p for p in got.parent.iterdir() if p.name.startswith(".")], "a staging directory was left"
    (patches / "x.patch").write_text("--- a/ggml/a.c\n+++ b/ggml/a.c\n@@ -1 +1 @@\n-int a = 1;\n+int a = 3;\n")
    again = builds.patched_tree(tree, ("x.patch",), "src-1")
    assert again != got and (again / "ggml" / "a.c").read_text() == "int a = 3;\n"  # new bytes, new copy
    assert builds.patched_tree(tree, (), "src-1") == tree


def test_a_patch_that_no_longer_applies_is_e_coded_and_leaves_no_copy(tmp_path, patches):
    (patches / "stale.patch").write_text("--- a/ggml/a.c\n+++ b/ggml/a.c\n@@ -1 +1 @@\n-int b = 9;\n+int b = 2;\n")
    with pytest.raises(SourceUnavailable) as info:
        builds.patched_tree(_mini_tree(tmp_path), ("stale.patch",), "src-1")
    assert "stale.patch" in info.value.message and "re-base" in (info.value.fix or "")
    assert not [p for p in (tmp_path / "cache" / "sources").iterdir() if not p.name.endswith(".lock")]


@pytest.mark.slow
def test_our_host_fixes_apply_to_the_pinned_tree(tmp_path, monkeypatch):
    tree = sources.llama_cpp_tree()  # from the shared cache; the copy goes to a fresh one
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    got = builds.patched_tree(tree, ggml_build.HOST_PATCHES, "pinned")
    text = (got / "ggml" / "src" / "ggml-virtgpu" / "backend" / "backend-dispatched-backend.cpp").read_text()
    assert text != (tree / "ggml" / "src" / "ggml-virtgpu" / "backend" / "backend-dispatched-backend.cpp").read_text()
