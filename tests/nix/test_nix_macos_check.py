"""checks/macos-nix, the Mac user's check of a Nix-built krun bundle, run here on captured tool
outputs (tests/data/macos/nix-krun/probe.json has the shape `--capture` writes on a Mac): the
report format, a failing bundle failing the right checks, and argument handling."""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "checks" / "macos-nix"
FIXTURE = REPO / "tests" / "data" / "macos" / "nix-krun"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["python3", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def report_lines(text: str) -> dict[str, str]:
    return {line[7:].split(":", 1)[0]: line[2:6] for line in text.splitlines() if line.startswith(("- PASS", "- FAIL"))}


def test_report_of_a_good_bundle(tmp_path: Path) -> None:
    out = tmp_path / "results" / "nix-krun.md"
    proc = run("--replay", str(FIXTURE), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.read_text() == proc.stdout
    lines = report_lines(proc.stdout)
    assert len(lines) == 21 and set(lines.values()) == {"PASS"}
    assert proc.stdout.startswith("# krun bundle built by Nix on macOS (checks/macos-nix)\n")
    assert (
        "- pinned krunkit: "
        + json.loads((REPO / "provision/data/pins.json").read_text())["sources"]["krunkit"]["version"]
        in proc.stdout
    )
    assert proc.stdout.endswith("21/21 checks passed\n")


def mutate(tmp_path: Path, change: dict[str, tuple[str, str]]) -> Path:
    """A copy of the fixture with text replaced in chosen command outputs / files."""
    data = json.loads((FIXTURE / "probe.json").read_text())
    for key, (old, new) in change.items():
        if key in data["commands"]:
            assert old in data["commands"][key]["output"], key
            data["commands"][key]["output"] = data["commands"][key]["output"].replace(old, new)
        else:
            (path,) = [p for p in data["files"] if p.endswith(key)]
            assert old in data["files"][path]
            data["files"][path] = data["files"][path].replace(old, new)
    folder = tmp_path / "captured"
    folder.mkdir()
    (folder / "probe.json").write_text(json.dumps(data))
    return folder


def test_a_bundle_with_the_issue_12_defects_fails_the_right_checks(tmp_path: Path) -> None:
    folder = mutate(
        tmp_path,
        {
            # defect 1: the APIR tree without our patch
            "nm-gU-virglrenderer": ("_virgl_renderer_resource_get_map_ptr\n", "_unrelated\n"),
            # defect 2 before the fix: MoltenVK looked up by bare name, libvulkan linked
            "strings-virglrenderer": ("/nix/store/ffffffffffffffffffffffffffffffff-MoltenVK-1.4.0/lib/", ""),
            "otool-L-virglrenderer": ("libepoxy.0.dylib", "libvulkan.1.dylib"),
            # a wrapper default that is not in the store, and an older krunkit
            "bin/krunkit": ("LIBRARY-'/nix/store/gggggggggggggggggggggggggggggggg", "LIBRARY-'/usr/local/opt/ggml"),
            "krunkit-version": ("1.3.2", "1.3.1"),
        },
    )
    proc = run("--replay", str(folder))
    assert proc.returncode == 1
    failed = {name for name, status in report_lines(proc.stdout).items() if status == "FAIL"}
    assert failed == {
        "virglrenderer defines every virgl function libkrun uses",
        "MoltenVK resolves from the store",
        "virglrenderer dlopens Vulkan (links no libvulkan)",
        "wrapper default VIRGL_APIR_BACKEND_LIBRARY",
        "krunkit --version",
    }
    assert "virgl_renderer_resource_get_map_ptr" in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replay", "/nonexistent-folder"], "no probe.json there"),
        (["--replay", str(FIXTURE), "--capture", "captured"], "exclude each other"),
    ],
)
def test_bad_arguments_are_refused_with_a_fix(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr


def test_a_capture_that_is_not_json_is_refused(tmp_path: Path) -> None:
    (tmp_path / "probe.json").write_text("{ not json")
    proc = run("--replay", str(tmp_path))
    assert proc.returncode == 2 and "not JSON" in proc.stderr and "fix:" in proc.stderr


def test_without_a_capture_it_needs_a_mac() -> None:
    assert platform.system() == "Linux"  # the suite runs on Debian; on a Mac this would build .#krun
    proc = run()
    assert proc.returncode == 2 and "needs macOS" in proc.stderr and "--replay" in proc.stderr


def venus_capture(tmp_path: Path, *, with_apir: bool = False, wrapper_env: bool = False) -> Path:
    """The fixture turned into the Venus bundle (.#krun): route file, bin/krunkit a symlink to the
    store krunkit (no wrapper), a virglrenderer without APIR."""
    data = json.loads((FIXTURE / "probe.json").read_text())
    bundle = data["bundle"]
    krunkit = data["realpath"][f"{bundle}/bin/.krunkit-wrapped"]
    data["files"][f"{bundle}/share/krun-gpu/route"] = "venus\n"
    data["files"][f"{bundle}/bin/krunkit"] = "export VIRGL_ROUTE_VENUS_TO_APIR=1\n" if wrapper_env else ""
    data["realpath"][f"{bundle}/bin/krunkit"] = krunkit
    strings = data["commands"]["strings-virglrenderer"]
    if not with_apir:
        strings["output"] = strings["output"].replace("VIRGL_APIR_BACKEND_LIBRARY\n", "")
    folder = tmp_path / "venus"
    folder.mkdir()
    (folder / "probe.json").write_text(json.dumps(data))
    return folder


def test_the_venus_bundle_is_checked_for_what_venus_needs(tmp_path: Path) -> None:
    proc = run("--replay", str(venus_capture(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = report_lines(proc.stdout)
    assert lines["Venus bundle sets no APIR variable"] == "PASS"
    assert lines["virglrenderer is the krunkit one (no APIR)"] == "PASS"
    assert not any(name.startswith(("wrapper default", "ggml")) for name in lines)


@pytest.mark.parametrize(
    ("kwargs", "failing"),
    [({"with_apir": True}, "virglrenderer is the krunkit one (no APIR)"),
     ({"wrapper_env": True}, "Venus bundle sets no APIR variable")],
)  # fmt: skip
def test_a_venus_bundle_carrying_apir_fails(tmp_path: Path, kwargs: dict, failing: str) -> None:
    proc = run("--replay", str(venus_capture(tmp_path, **kwargs)))
    assert proc.returncode == 1
    assert report_lines(proc.stdout)[failing] == "FAIL"
