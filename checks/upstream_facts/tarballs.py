"""Opening a pinned tree from ../shared/upstream: a `git archive` tarball (or its unpacked folder),
refused unless its NAR hash is the one its pin (or its stand-in below) names."""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

from .trees import REPO, FactsError, Tree

sys.path.insert(0, str(REPO))
from provision.core.errors import ProvisionError, SourceUnavailable  # noqa: E402

__all__ = ["ProvisionError", "open_archive"]

# Trees whose pin is out of reach here, read at the nearest release ../shared/upstream holds. The pins
# name releases nobody here can hash (libkrun v1.19.3, krunkit v1.3.2) or a GitLab archive
# (the 0.10.4e-krunkit tag), so the tree read is named here: tarball, commit, NAR hash of the unpacked folder
# (../shared/upstream/README.md; each re-hashed with `nix hash path --sri`).
# A pin whose own tree is out of reach names the nearest tree of ../shared/upstream in its
# `standin_tarball` (provision/data/pins.json): file, rev and NAR hash, written there once.
TARBALL_SUFFIX = ".tar.xz"


class FolderTree(Tree):
    """A tree unpacked from a `git archive`: files read from disk; it has no history."""

    def git(self, *args: str, check: bool = True) -> str:
        raise FactsError(f"{self.name}: an archive has no git history (git {' '.join(args)})")

    def show_bytes(self, file: str) -> bytes | None:
        path = self.path / file
        if path.is_symlink():  # as `git show` gives a link: its target
            return os.readlink(path).encode()
        return path.read_bytes() if path.is_file() else None

    def files(self, under: str) -> list[str]:
        base = self.path / under
        if not base.is_dir():
            return []
        # What `git ls-tree -r --name-only` lists: files and symlinks, never folders.
        found = (p for p in base.rglob("*") if p.is_symlink() or p.is_file())
        return sorted(str(p.relative_to(self.path)) for p in found)


def nar_hash(path: Path) -> str:
    """The tree's NAR hash, as provision checks every pinned tree (provision/adapters/nix.py)."""
    from provision.adapters import nix
    from provision.core.errors import ProvisionError

    try:
        return nix.hash_path(path)
    except ProvisionError as exc:
        raise FactsError(f"{exc.message}\nfix: {exc.fix}") from None


def wanted(name: str, pin: dict[str, Any]) -> tuple[str, str, str, bool]:
    """(tarball, commit, NAR hash, is the pin itself) for the tree read for pin `name`."""
    if "upstream_tarball" in pin:
        return pin["upstream_tarball"], pin["rev"], pin["hash"], True
    if "standin_tarball" in pin:
        stand_in = pin["standin_tarball"]
        return stand_in["file"], stand_in["rev"], stand_in["hash"], False
    raise FactsError(
        f"{name}: no tree of ../shared/upstream stands for this pin\n"
        f"fix: provision/data/pins.json, sources.{name}.upstream_tarball = the tarball of its rev"
    )


def unpack(upstream: Path, tarball: str, commit: str, work: Path) -> Path:
    """The folder of `tarball` (unpacked under work), or the unpacked folder beside it."""
    folder = upstream / tarball.removesuffix(TARBALL_SUFFIX)
    if folder.is_dir():
        return folder
    path = upstream / tarball
    if not path.is_file():
        raise FactsError(
            f"--upstream {upstream.name}: neither {tarball} nor its folder is there\n"
            "fix: pass --upstream ../shared/upstream (the pinned tarballs)"
        )
    dest = work / folder.name
    if dest.is_dir():  # two pins, one tarball (virglrenderer-apir and -apir-macos)
        return dest / folder.name
    try:
        with tarfile.open(path) as tar:
            tar.next()
            recorded = tar.pax_headers.get("comment")
            if recorded is not None and recorded != commit:
                raise SourceUnavailable(
                    f"{tarball}: git archive of {recorded}, not the pinned {commit}; refused",
                    fix=f"use the unmodified {tarball} of ../shared/upstream (its README lists the commits)",
                )
            tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
            if tops != {folder.name}:
                raise FactsError(f"{tarball}: expected the one folder {folder.name}, found {sorted(tops)[:5]}")
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, OSError, EOFError) as err:
        shutil.rmtree(dest, ignore_errors=True)
        raise SourceUnavailable(f"{tarball}: cannot unpack ({err})", fix=f"use the unmodified {tarball}") from err
    return dest / folder.name


def open_archive(name: str, upstream: Path, pins: dict[str, Any], work: Path) -> tuple[Tree, dict[str, Any]]:
    pin = pins[name]
    tarball, commit, expected, is_pin = wanted(name, pin)
    folder = unpack(upstream, tarball, commit, work)
    got = nar_hash(folder)
    if got != expected:
        where = f"sources.{name}.hash" if is_pin else f"sources.{name}.standin_tarball.hash"
        raise SourceUnavailable(
            f"{tarball}: NAR hash {got} is not {expected} ({where}); refused",
            fix=f"use the unmodified {tarball} of ../shared/upstream (its README lists the NAR hashes)",
        )
    source = f"{pin['owner']}/{pin['repo']}" if "owner" in pin else "slp/virglrenderer"
    info = {
        "source": source,
        "pinned": pin.get("rev") or pin.get("tag") or pin.get("version"),
        "read_rev": commit,
        "pin_in_clone": is_pin,
    }
    return FolderTree(name, folder, commit), info
