"""The APIR virglrenderer source: checked against its pin, fixes applied by commit id, and
a clear way out when the tree cannot be fetched."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from provision.adapters import nix
from provision.apir import virglrenderer as virgl_apir
from provision.core import errors, pins


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
        "HOME": str(repo),
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


@pytest.fixture()
def tree_repo(tmp_path: Path) -> tuple[Path, str, str]:
    repo = tmp_path / "virgl"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "meson.build").write_text("project('virglrenderer', 'c', version: '1.2.0')\n")
    (repo / "src").mkdir()
    (repo / "src" / "threads.h").write_text("typedef int once_flag;\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "src" / "threads.h").write_text("#include <threads.h>\n")
    git(repo, "commit", "-qam", "fix: build on c23")
    fix = git(repo, "rev-parse", "HEAD")
    return repo, base, fix


def test_pin_points_at_the_mr_head_with_the_three_sid_fixes():
    pin = pins.default().source("virglrenderer-apir")
    assert pin["rev"].startswith("c62e4b08")
    assert [f.commit[:8] for f in virgl_apir.fixes(pin)] == ["3f0f775e", "986b5fc5", "d5593cc1"]
    args = virgl_apir.meson_setup_args("build", pin)
    assert "-Dapir=true" in args and "-Dvenus=true" in args
    assert not any(a.startswith("-Ddrm") or a.startswith("-Drender-server") for a in args)


def test_unreachable_tree_names_the_rev_and_virgl_src():
    pin = pins.default().source("virglrenderer-apir")
    err = virgl_apir.unreachable(pin)
    assert pin["rev"] in err.message and err.code == "E042"
    assert err.fix and "--virgl-src" in err.fix


def test_not_a_repository_is_refused(tmp_path):
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir.verify_source(tmp_path, pins.default().source("virglrenderer-apir"))
    assert "not a git repository" in exc.value.message


def test_a_clone_without_the_pinned_commit_is_refused(tree_repo):
    repo, _, _ = tree_repo
    pin = pins.default().source("virglrenderer-apir")
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir.verify_source(repo, pin)
    assert pin["rev"] in exc.value.message


def _pin(base: str, fix: str, digest: str) -> pins.SourcePin:
    real = pins.default().source("virglrenderer-apir")
    attrs = dict(real.attrs, rev=base, hash=digest, linux_fixes=[{"commit": fix, "why": "test"}])
    return pins.SourcePin("virglrenderer-apir", "fetchFromGitHub", "COMPUTED", "test", attrs)


def test_tree_hash_is_checked_and_fixes_are_applied(tree_repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    repo, base, fix = tree_repo
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir.prepare_tree(repo, _pin(base, fix, "sha256-" + "A" * 43 + "="))
    assert "hashes to" in exc.value.message and not list((tmp_path / "cache" / "virgl-apir").glob("src-*"))
    # the expected hash, computed independently from a pristine export of the base commit
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    subprocess.run(f"git -C {repo} archive {base} | tar -x -C {pristine}", shell=True, check=True)
    tree = virgl_apir.prepare_tree(repo, _pin(base, fix, nix.hash_path(pristine)))
    assert (tree / "src" / "threads.h").read_text() == "#include <threads.h>\n"
    assert (tree / "meson.build").exists()


@pytest.mark.root
def test_fetch_without_network_fails_with_the_way_out(tmp_path, monkeypatch, refused_network):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    pin = pins.default().source("virglrenderer-apir")
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir.fetch_pinned(pin, timeout_s=30)
    assert pin["rev"] in exc.value.message and "--virgl-src" in (exc.value.fix or "")


# --- the pinned tree from a git archive (../shared/upstream/, what CI builds from) ----------------

REPO = Path(__file__).resolve().parents[2]


def shared_archive() -> Path:
    """The pinned tree's tarball beside the checkout (the upstream README's name for it)."""
    pin = pins.default().source("virglrenderer-apir")
    path = REPO.parent / "shared" / "upstream" / f"virglrenderer-{pin['owner']}-{pin['rev'][:8]}.tar.xz"
    if not path.is_file():
        pytest.fail(f"{path} is missing: CI keeps the pinned upstream trees in ../shared/upstream/")
    return path


@pytest.mark.nix
def test_the_shared_archive_is_checked_against_the_pin_and_gets_every_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    pin = pins.default().source("virglrenderer-apir")
    tree = virgl_apir.prepare_tree(shared_archive(), pin)
    # Each fix is in: the two upstream glibc fixes and our resource_map_fixed stand-in.
    assert "virgl_renderer_resource_map_fixed(uint32_t res_handle, void *addr)" in (
        tree / "src/virglrenderer.c").read_text()
    assert "const char* str = memchr" in (tree / "src/gallium/auxiliary/tgsi/tgsi_text.c").read_text()
    # Cached under a key of the pin: the same pin gives the same tree without unpacking again.
    assert pin["rev"][:12] in tree.name and virgl_apir.prepare_tree(shared_archive(), pin) == tree


@pytest.mark.nix
def test_an_archive_whose_tree_differs_from_the_pin_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(["tar", "-xf", str(shared_archive()), "-C", str(unpacked)], check=True)
    (top,) = unpacked.iterdir()
    (top / "meson.build").write_text((top / "meson.build").read_text() + "# changed\n")
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir.prepare_tree(top, pins.default().source("virglrenderer-apir"))
    assert "hashes to" in exc.value.message and pins.default().source("virglrenderer-apir")["hash"] in exc.value.message
    assert not list((tmp_path / "cache" / "virgl-apir").glob("src-*"))


def test_an_archive_cannot_stand_in_for_a_fix_that_has_no_patch_file(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    real = pins.default().source("virglrenderer-apir")
    pin = dataclasses.replace(real, attrs={**real.attrs, "linux_fixes": [{"commit": "d" * 40, "why": "repo only"}]})
    fix = virgl_apir.fixes(pin)[0]
    with pytest.raises(errors.SourceUnavailable) as exc:
        virgl_apir._fix_diff(fix, pin, None, tmp_path / "tree.tar.xz")
    assert "dddddddd" in exc.value.message and "archive_patch" in exc.value.fix
