"""checks/upstream-facts --upstream: the facts file regenerated in CI from the pinned `git archive`
tarballs of ../shared/upstream, byte-identical to the committed one; a tree that is not its pin's
(changed content, another commit) is refused with E042, and nothing is written."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from .nix_facts import FACTS, REPO

UPSTREAM = REPO.parent / "shared" / "upstream"
SCRIPT = REPO / "checks" / "upstream-facts"
KRUNKIT = "krunkit-v1.3.1.tar.xz"  # the smallest tarball, read last: every other tree passes first


def facts_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300, cwd=REPO
    )


def test_facts_regenerate_from_shared_upstream_byte_identically(tmp_path: Path) -> None:
    # Only what no archive holds is given: everything else must come from the trees themselves.
    committed = json.loads(FACTS.read_text())
    only_read = tmp_path / "read.json"
    fixes = {name: {"fixes": tree["fixes"]} for name, tree in committed["patches"].items()}
    only_read.write_text(json.dumps({"nixpkgs": committed["nixpkgs"], "patches": fixes}))
    out = tmp_path / "upstream.json"
    proc = facts_cli("--upstream", UPSTREAM, "--read", only_read, "--out", out, "--stub-out", tmp_path / "stub.json")
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == FACTS.read_bytes()
    assert not (tmp_path / "stub.json").exists()  # nixpkgs was not read: its stub is not rewritten
    data = json.loads(out.read_text())
    for section, tarball in (("libkrun", "libkrun-v1.19.0.tar.xz"), ("krunkit", KRUNKIT)):
        assert data[section]["read_rev"] == tarball_commit(UPSTREAM / tarball)
    assert set(data["_sections"]) == {k for k in data if not k.startswith("_")}
    assert data["_sections"]["nixpkgs"].startswith("READ")


def test_check_mode_says_when_the_committed_facts_are_stale(tmp_path: Path) -> None:
    stale = tmp_path / "upstream.json"
    data = json.loads(FACTS.read_text())
    data["krunkit"]["version"] = "9.9.9"
    stale.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    proc = facts_cli("--upstream", UPSTREAM, "--read", FACTS, "--out", stale, "--check")
    assert proc.returncode == 1 and "differs from what the trees say" in proc.stderr
    assert facts_cli("--upstream", UPSTREAM, "--check").returncode == 0


def tarball_commit(path: Path) -> str:
    with tarfile.open(path) as tar:
        tar.next()
        return tar.pax_headers["comment"]


def repack(src: Path, dest: Path, *, change: bool, commit: str | None = None) -> None:
    """src rewritten to dest, with krunkit's Makefile changed (change) or another commit recorded."""
    headers = {"comment": commit or tarball_commit(src)}
    with tarfile.open(src) as old, tarfile.open(dest, "w:xz", format=tarfile.PAX_FORMAT, pax_headers=headers) as new:
        for member in old.getmembers():
            data = old.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if change and data is not None and member.name.endswith("/Makefile"):
                data += b"\n# changed\n"
                member.size = len(data)
            new.addfile(member, io.BytesIO(data) if data is not None else None)


def upstream_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "upstream"
    copy.mkdir()
    for tarball in UPSTREAM.glob("*.tar.xz"):
        (copy / tarball.name).symlink_to(tarball)
    (copy / KRUNKIT).unlink()
    return copy


@pytest.mark.parametrize("how", ["changed-tarball", "changed-folder", "other-commit", "truncated"])
def test_a_tree_that_is_not_its_pin_is_refused(tmp_path: Path, how: str) -> None:
    copy = upstream_copy(tmp_path)
    if how == "changed-folder":
        with tarfile.open(UPSTREAM / KRUNKIT) as tar:
            tar.extractall(copy, filter="data")
        with (copy / KRUNKIT.removesuffix(".tar.xz") / "Makefile").open("a") as makefile:
            makefile.write("# changed\n")
    elif how == "truncated":
        (copy / KRUNKIT).write_bytes((UPSTREAM / KRUNKIT).read_bytes()[:400_000])
    else:
        other = "0" * 40 if how == "other-commit" else None
        repack(UPSTREAM / KRUNKIT, copy / KRUNKIT, change=how == "changed-tarball", commit=other)
    out = tmp_path / "upstream.json"
    proc = facts_cli("--upstream", copy, "--read", FACTS, "--out", out)
    assert proc.returncode == 52, proc.stderr  # E042's exit status
    assert "Traceback" not in proc.stderr and "E042: krunkit-v1.3.1.tar.xz" in proc.stderr
    assert "fix: use the unmodified krunkit-v1.3.1.tar.xz" in proc.stderr
    if how in ("changed-tarball", "changed-folder"):
        assert "NAR hash" in proc.stderr and "sha256-5Ds65oRX" in proc.stderr
    assert not out.exists()


def test_facts_read_before_for_other_fix_commits_are_not_kept(tmp_path: Path) -> None:
    data = json.loads(FACTS.read_text())
    data["patches"]["virglrenderer-apir"]["fixes"][0]["rev"] = "0" * 40
    read = tmp_path / "read.json"
    read.write_text(json.dumps(data))
    proc = facts_cli("--upstream", UPSTREAM, "--read", read, "--out", tmp_path / "out.json")
    assert proc.returncode == 2 and "fixes read before" in proc.stderr and "fix: " in proc.stderr, proc.stderr
