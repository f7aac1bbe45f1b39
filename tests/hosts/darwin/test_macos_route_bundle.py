"""Venus and APIR are two bundles on macOS (.#krun, .#krun-apir): `provision launch --route apir`
starts the APIR one, never the Venus one, and `provision doctor` says which virglrenderer is in
force. Bundles are built here (real dylibs, a real krunkit script) and found through real profile
folders; the CLI runs in-process as the console script would."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provision.core import errors
from provision.core.errors import KrunBundleMissing
from provision.hosts.darwin import bundle as bundle_mod
from provision.hosts.darwin.doctor import check_virglrenderer_in_force
from tests.hosts.darwin.macos_fixtures import make_bundle
from tests.hosts.darwin.test_macos_launch import provision_cli  # noqa: F401  (fixture)


def routed(root: Path, route: str) -> Path:
    make_bundle(root, apir=route == "apir")
    (root / bundle_mod.ROUTE_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / bundle_mod.ROUTE_FILE).write_text(route + "\n")
    return root


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with the Venus bundle in ~/.nix-profile and the APIR one in its own profile."""
    h = tmp_path / "home"
    routed(h / ".nix-profile", "venus")
    routed(h / ".local" / "state" / "nix" / "profiles" / "krun-apir", "apir")
    return h


def env_of(home: Path, tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(home), "USER": "nobody-here", "PROVISION_STATE": str(tmp_path / "state")}


def test_each_route_finds_its_own_bundle(home: Path) -> None:
    env = {"HOME": str(home)}
    assert bundle_mod.locate(env=env, home=home, route="venus").root == home / ".nix-profile"
    apir = bundle_mod.locate(env=env, home=home, route="apir")
    assert apir.root == home / ".local/state/nix/profiles/krun-apir" and apir.route == "apir"


def test_apir_never_falls_back_to_the_venus_bundle(tmp_path: Path) -> None:
    home = tmp_path / "h"
    routed(home / ".nix-profile", "venus")
    with pytest.raises(KrunBundleMissing) as exc:
        bundle_mod.locate(env={"HOME": str(home)}, home=home, route="apir")
    assert "apir route" in exc.value.message
    assert f"--profile {home}/.local/state/nix/profiles/krun-apir .#krun-apir" in exc.value.fix
    with pytest.raises(KrunBundleMissing) as exc:
        bundle_mod.locate(home / ".nix-profile", env={}, home=home, route="apir")
    assert "is the venus bundle" in exc.value.message and ".#krun-apir" in exc.value.fix


@pytest.mark.parametrize("text", ["", "metal\n", "apir; rm -rf /\n"])
def test_a_route_file_that_names_no_route_is_unmarked(tmp_path: Path, text: str) -> None:
    root = make_bundle(tmp_path / "b")
    (root / bundle_mod.ROUTE_FILE).parent.mkdir(parents=True)
    (root / bundle_mod.ROUTE_FILE).write_text(text)
    assert bundle_mod.KrunBundle(root).route is None


def test_launch_route_apir_plans_the_apir_bundle(home: Path, tmp_path: Path, provision_cli) -> None:  # noqa: F811
    env = env_of(home, tmp_path)
    res = provision_cli(["launch", "--dry-run", "--json", "--route", "apir", "--memory", "8192"], env)
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)["data"]
    apir = home / ".local/state/nix/profiles/krun-apir"
    assert plan["route"] == "apir"
    assert plan["env"]["CONTAINERS_HELPER_BINARY_DIR"] == f"{apir}/bin"
    assert plan["env"]["VIRGL_APIR_BACKEND_LIBRARY"] == f"{apir}/lib/libggml-virtgpu-backend.dylib"
    venus = json.loads(provision_cli(["launch", "--dry-run", "--json", "--memory", "8192"], env).stdout)["data"]
    assert venus["env"]["CONTAINERS_HELPER_BINARY_DIR"] == f"{home}/.nix-profile/bin"
    assert "VIRGL_APIR_BACKEND_LIBRARY" not in venus["env"]


def test_launch_route_apir_without_its_bundle_is_e030(tmp_path: Path, provision_cli) -> None:  # noqa: F811
    home = tmp_path / "h"
    routed(home / ".nix-profile", "venus")
    res = provision_cli(["launch", "--dry-run", "--route", "apir"], env_of(home, tmp_path))
    assert res.returncode == errors.KrunBundleMissing.exit_status
    assert "E030" in res.stderr and ".#krun-apir" in res.stderr and "Traceback" not in res.stderr


def test_doctor_says_which_virglrenderer_is_in_force(home: Path) -> None:
    venus = bundle_mod.KrunBundle(home / ".nix-profile")
    check = check_virglrenderer_in_force(venus, None)
    assert check.status == "ok" and "the krunkit virglrenderer (Venus on MoltenVK)" in check.evidence
    assert str(venus.virglrenderer.resolve()) in check.evidence
    apir = bundle_mod.KrunBundle(home / ".local/state/nix/profiles/krun-apir")
    assert "the APIR virglrenderer" in check_virglrenderer_in_force(apir, "apir").evidence
    mismatch = check_virglrenderer_in_force(venus, "apir")
    assert mismatch.status == "fail" and "last launched on the apir route" in mismatch.evidence
    assert mismatch.fix and "--route apir" in mismatch.fix
    venus.virglrenderer.unlink()
    assert check_virglrenderer_in_force(venus, None).status == "fail"


def test_the_venus_bundle_is_not_reported_as_an_apir_bundle_missing_pieces(home: Path) -> None:
    from provision.hosts.darwin.podman_checks import check_apir_bundle

    venus = check_apir_bundle(bundle_mod.KrunBundle(home / ".nix-profile"))
    assert venus.status == "skip" and ".#krun-apir" in venus.evidence
    assert check_apir_bundle(bundle_mod.KrunBundle(home / ".local/state/nix/profiles/krun-apir")).status == "ok"
