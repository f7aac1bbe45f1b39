"""docs/nix.md's side-by-side of our macOS Venus recipe against nixpkgs' libkrun-efi and the libkrun
Homebrew tap is generated (checks/nix-side-by-side) from `nix eval` of the flake and pins.json's
reference_recipes; this keeps the committed block equal to what they say now."""

from __future__ import annotations

import json
import sys

import pytest

from .nix_helpers import DARWIN, REPO, Nix, copy_flake

sys.path.insert(0, str(REPO / "checks"))
import nix_side_by_side as sbs  # noqa: E402


@pytest.fixture(scope="module")
def nix(tmp_path_factory: pytest.TempPathFactory) -> Nix:
    return Nix(tmp_path_factory.mktemp("nix-home"), copy_flake(tmp_path_factory.mktemp("flake") / "repo"))


def test_docs_side_by_side_is_what_the_recipe_and_the_references_say(nix: Nix) -> None:
    ours = sbs.ours(nix.eval(f"packages.{DARWIN}", sbs.EVAL_EXPR))
    refs = json.loads((REPO / "provision/data/pins.json").read_text())["reference_recipes"]
    block = sbs.block_of((REPO / "docs/nix.md").read_text())
    assert block is not None, "docs/nix.md lost its side-by-side block"
    assert block == sbs.render(ours, refs), "stale: run .venv/bin/python checks/nix-side-by-side"
    # the facts behind the rows: krunkit's virglrenderer and flags, what .#krun's libkrun links
    assert sorted(ours["virglrenderer_meson_flags"]) == sorted(refs["nixpkgs-libkrun-efi"]["virglrenderer_meson_flags"])
    # the Venus tree is the tap's: same tag, and our SRI hash is the tap's hex sha256
    assert ours["virglrenderer_version"] == refs["homebrew-krun"]["virglrenderer_version"]
    venus = json.loads((REPO / "provision/data/pins.json").read_text())["sources"]["virglrenderer-venus"]
    assert f"sha256 {venus['sha256']}" in refs["homebrew-krun"]["virglrenderer_source"]
    assert ours["virglrenderer_source"].endswith(venus["hash"])
    assert ours["install"].endswith("install -Dm755 target/release/krunkit")


def test_every_row_has_a_reason_and_every_reference_a_source() -> None:
    refs = json.loads((REPO / "provision/data/pins.json").read_text())["reference_recipes"]
    for name, ref in refs.items():
        if name.startswith("_"):
            continue
        assert ref["status"] == "READ" and "@" in ref["file"], name
        for _, key, why in sbs.ROWS:
            assert key in ref and why.strip(), (name, key)
