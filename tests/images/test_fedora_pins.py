"""checks/fedora-pins: the Fedora image and COPR Mesa pins checked against repoquery output
(fixtures in tests/data/fedora-pins), and pins.json rewritten whole only when every pin holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision.core import errors, pins
from provision.images import fedora_pins

DATA = Path(__file__).parents[1] / "data" / "fedora-pins"


def run_check(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repo / "checks" / "fedora-pins"), *args], capture_output=True, text=True)


@pytest.fixture
def pins_copy(tmp_path) -> Path:
    path = tmp_path / "pins.json"
    path.write_bytes(pins.default_path().read_bytes())
    return path


def test_every_pin_found_marks_the_fedora_section_verified(repo, pins_copy):
    before = json.loads(pins_copy.read_text())
    assert before["fedora"]["status"] == "READ"
    proc = run_check(repo, "--from", str(DATA / "holds.txt"), "--pins", str(pins_copy))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok    fedora.mesa_filesystem = mesa-filesystem-25.3.6-102.fc44" in proc.stdout
    after = json.loads(pins_copy.read_text())
    assert after["fedora"]["status"] == "VERIFIED"
    check = after["fedora"]["verification"]
    assert "mesa-vulkan-drivers-25.3.6-102.fc44.aarch64, mesa-vulkan-drivers-25.3.6-102.fc44.x86_64" in check
    assert "VERSION_ID=44" in check and "-103." not in check
    # nothing else changed, the provenance included; the result still loads
    assert {k: v for k, v in after.items() if k != "fedora"} == {k: v for k, v in before.items() if k != "fedora"}
    assert after["fedora"]["provenance"] == before["fedora"]["provenance"]
    assert pins.load(pins_copy).fedora["status"] == "VERIFIED"
    assert [p.name for p in pins_copy.parent.iterdir()] == ["pins.json"], "no temp file left behind"


@pytest.mark.parametrize(
    ("fixture", "failing"),
    [
        ("stock-only.txt", "FAIL  fedora.mesa_vulkan_drivers = mesa-vulkan-drivers-25.3.6-102.fc44: not among"),
        ("wrong-release.txt", "FAIL  fedora.image = fedora:44: os-release VERSION_ID=43"),
    ],
)
def test_a_pin_that_does_not_hold_fails_and_leaves_pins_json_alone(repo, pins_copy, fixture, failing):
    before = pins_copy.read_bytes()
    proc = run_check(repo, "--from", str(DATA / fixture), "--pins", str(pins_copy))
    assert proc.returncode == errors.InvalidValue.exit_status
    assert failing in proc.stdout
    assert "E003: fedora pins do not hold" in proc.stderr
    assert pins_copy.read_bytes() == before


def test_dry_run_reports_without_writing(repo, pins_copy):
    before = pins_copy.read_bytes()
    proc = run_check(repo, "--from", str(DATA / "holds.txt"), "--pins", str(pins_copy), "--dry-run")
    assert proc.returncode == 0 and "dry run" in proc.stdout
    assert pins_copy.read_bytes() == before


def test_the_query_enables_the_pinned_copr_and_asks_for_both_mesa_packages(repo):
    proc = run_check(repo, "--print-script")
    assert proc.returncode == 0
    script = proc.stdout.strip()
    fedora = pins.default().fedora
    assert f"dnf copr enable -y {fedora['copr']}" in script
    assert script.endswith("dnf repoquery -q --repo='copr:*' mesa-filesystem mesa-vulkan-drivers")
    assert script.index(fedora_pins.OS_RELEASE_MARK) < script.index(fedora_pins.REPOQUERY_MARK)


def test_a_nevr_of_another_release_than_the_image_is_refused(tmp_path):
    data = json.loads(pins.default_path().read_text())
    data["fedora"]["mesa_filesystem"] = "mesa-filesystem-25.3.6-102.fc43"
    with pytest.raises(errors.InvalidValue) as exc:
        fedora_pins.nevrs(data["fedora"])
    assert "fedora.mesa_filesystem" in exc.value.message and "fc43" in exc.value.message
    data["fedora"]["mesa_filesystem"] = "mesa-filesystem-25.3.6-102.fc44; reboot"
    with pytest.raises(errors.InvalidValue):
        fedora_pins.nevrs(data["fedora"])


def test_pins_json_nevrs_match_the_image_release():
    assert fedora_pins.nevrs(pins.default().fedora) == {
        "mesa_vulkan_drivers": "mesa-vulkan-drivers-25.3.6-102.fc44",
        "mesa_filesystem": "mesa-filesystem-25.3.6-102.fc44",
    }
