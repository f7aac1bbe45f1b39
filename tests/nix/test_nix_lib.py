"""nix/lib (pure helpers) and the stub nixpkgs' lib, evaluated with real nix-instantiate."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from provision.core import pins as pins_mod

from .nix_helpers import REPO, STUB, nix_env, require

STUB_LIB = f"import {STUB}/lib.nix"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return nix_env(tmp_path_factory.mktemp("nix-home"))


def instantiate_eval(env: dict[str, str], expr: str) -> Any:
    proc = subprocess.run(
        [require("nix-instantiate"), "--eval", "--strict", "--json", "--expr", expr],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def nix_files() -> list[Path]:
    skip = {".venv", ".git", ".cache", "build", "out"}
    return sorted(p for p in REPO.rglob("*.nix") if not skip.intersection(p.relative_to(REPO).parts))


def test_every_nix_file_parses(env: dict[str, str]) -> None:
    files = nix_files()
    names = {str(p.relative_to(REPO)) for p in files}
    assert {"flake.nix", "nix/overlay.nix", "nix/lib/tests.nix", "nix/tests/stub-nixpkgs/flake.nix"} <= names
    for path in files:
        proc = subprocess.run(
            [require("nix-instantiate"), "--parse", str(path)], env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{path}: {proc.stderr}"


def test_lib_unit_tests_all_pass(env: dict[str, str]) -> None:
    failures = instantiate_eval(env, f"import ./nix/lib/tests.nix {{ lib = {STUB_LIB}; }}")
    assert failures == []


def test_run_tests_reports_a_failing_case(env: dict[str, str]) -> None:
    # The runner the lib tests rely on must report a wrong expectation, not swallow it.
    expr = f"""
      let lib = {STUB_LIB}; k = import ./nix/lib {{ inherit lib; }}; in
      lib.runTests {{ testWrong = {{ expr = k.virglrenderer.mesonFlags {{ version = "1.2.0"; }};
                                     expected = [ "-Ddrm=disabled" ]; }}; }}
    """
    failures = instantiate_eval(env, expr)
    assert failures == [
        {"name": "testWrong", "expected": ["-Ddrm=disabled"], "result": ["-Dvenus=true", "-Dapir=false"]}
    ]


def test_stub_lib_flag_formats_are_nixpkgs_formats(env: dict[str, str]) -> None:
    # Output formats documented in nixpkgs lib/strings.nix.
    got = instantiate_eval(
        env,
        f"""let lib = {STUB_LIB}; in [
          (lib.cmakeBool "ENABLE_STATIC_LIBS" false) (lib.cmakeBool "X" true)
          (lib.cmakeFeature "MODULES" "badblock") (lib.mesonOption "engine" "opengl")
          (lib.mesonBool "hardened" true) (lib.mesonEnable "savage" false) (lib.mesonEnable "docs" true) ]""",
    )
    assert got == [
        "-DENABLE_STATIC_LIBS:BOOL=FALSE",
        "-DX:BOOL=TRUE",
        "-DMODULES:STRING=badblock",
        "-Dengine=opengl",
        "-Dhardened=true",
        "-Dsavage=disabled",
        "-Ddocs=enabled",
    ]


@pytest.mark.parametrize(
    ("pin", "request_", "expected"),
    [
        (
            "virglrenderer-venus",
            "{ venus = true; renderServer = false; drm = false; }",
            ["-Dvenus=true", "-Drender-server=false", "-Ddrm=disabled"],
        ),
        ("virglrenderer-apir", "{ apir = true; renderServer = false; drm = false; }", ["-Dvenus=true", "-Dapir=true"]),
        (
            "virglrenderer-apir-darwin",
            "{ apir = true; renderServer = false; drm = false; vulkanDload = false; }",
            ["-Dvenus=true", "-Dapir=true", "-Dvulkan-dload=false"],
        ),
    ],
)
def test_meson_flags_for_each_pinned_virglrenderer_tree(
    env: dict[str, str], pin: str, request_: str, expected: list[str]
) -> None:
    version = pins_mod.load().source(pin)["meson_version"]
    flags = instantiate_eval(
        env,
        f"""let lib = {STUB_LIB}; k = import ./nix/lib {{ inherit lib; }}; in
            k.virglrenderer.mesonFlags ({request_} // {{ version = "{version}"; }})""",
    )
    assert flags == expected
