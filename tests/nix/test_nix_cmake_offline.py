"""patches/cmake/ggml-virtgpu-offline.cmake with real cmake + ninja: a project shaped like
ggml-virtgpu (ExternalProject venus_hw_header in a subdirectory, in ALL, depended on by a target)
builds without a download step when the file is given as CMAKE_PROJECT_INCLUDE."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .nix_helpers import REPO, require

INCLUDE = REPO / "patches" / "cmake" / "ggml-virtgpu-offline.cmake"


def make_project(root: Path, external_name: str = "venus_hw_header") -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\nproject(shaped_like_llama C)\nadd_subdirectory(sub)\n"
    )
    # Same shape as ggml/src/ggml-virtgpu/CMakeLists.txt; the URL is a local port nobody serves.
    (root / "sub" / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.19)\n"
        "include(ExternalProject)\n"
        f"ExternalProject_Add({external_name}\n"
        "  URL http://127.0.0.1:9/venus_hw.h\n"
        "  DOWNLOAD_NO_EXTRACT YES\n"
        "  DOWNLOAD_DIR ${CMAKE_CURRENT_SOURCE_DIR}/include\n"
        '  CONFIGURE_COMMAND ""\n  BUILD_COMMAND ""\n  INSTALL_COMMAND ""\n)\n'
        "add_custom_target(backend ALL COMMAND ${CMAKE_COMMAND} -E echo backend-built)\n"
        f"add_dependencies(backend {external_name})\n"
        # like the guest frontend: includes venus_hw.h from its private (binary) include dir
        "add_library(frontend STATIC frontend.c)\n"
        "target_include_directories(frontend PRIVATE ${CMAKE_CURRENT_BINARY_DIR})\n"
        f"add_dependencies(frontend {external_name})\n"
    )
    (root / "sub" / "frontend.c").write_text('#include "venus_hw.h"\nint frontend(void) { return 0; }\n')
    return root


def configure(src: Path, build: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("cmake"), "-S", str(src), "-B", str(build), "-G", "Ninja", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def ninja(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require("ninja"), "-C", str(build), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    return make_project(tmp_path / "src")


def test_without_the_include_all_would_download(project: Path, tmp_path: Path) -> None:
    # The trap the include exists for: the download step is part of `all`.
    build = tmp_path / "build"
    assert configure(project, build).returncode == 0
    plan = ninja(build, "-n", "all")
    assert plan.returncode == 0
    assert "download step" in plan.stdout.lower() and "venus_hw_header" in plan.stdout


def test_with_the_include_all_builds_offline(project: Path, tmp_path: Path) -> None:
    build = tmp_path / "build"
    conf = configure(project, build, f"-DCMAKE_PROJECT_INCLUDE={INCLUDE}")
    assert conf.returncode == 0, conf.stderr
    assert "venus_hw_header is an empty target" in conf.stdout
    plan = ninja(build, "-n", "all")
    assert "download" not in plan.stdout.lower()
    built = ninja(build, "all")
    assert built.returncode == 0, built.stdout
    assert "backend-built" in built.stdout
    assert not (project / "sub" / "include" / "venus_hw.h").exists()


def test_any_other_external_project_fails_at_configure_time(tmp_path: Path) -> None:
    src = make_project(tmp_path / "src", external_name="other_download")
    conf = configure(src, tmp_path / "build", f"-DCMAKE_PROJECT_INCLUDE={INCLUDE}")
    assert conf.returncode != 0
    assert "ExternalProject 'other_download' would download during the build" in conf.stderr
