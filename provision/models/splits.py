"""Split GGUFs in the store: split/<name>/<part file names> -> the blobs.

llama.cpp opens part 1 and finds part K by its name (``…-0000K-of-0000N.gguf``) beside it, so a
split model is a folder of relative symlinks into blobs/, made again whenever one is missing or
points elsewhere (each link appears by rename). Imports core only.
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.models.records import Ref
from provision.models.refs import check_name


def part_one(root: Path, ref: Ref) -> Path:
    """Where part 1 of a split model is, its siblings beside it, once linked (a plan's answer: nothing made)."""
    assert ref.parts
    return root / "split" / check_name(ref.name) / ref.parts[0]["file"]


def link_parts(root: Path, ref: Ref) -> Path:
    """The path of part 1, with every part linked beside it."""
    assert ref.parts
    folder = part_one(root, ref).parent
    folder.mkdir(parents=True, exist_ok=True)
    for part in ref.parts:
        link = folder / part["file"]
        target = Path("..") / ".." / "blobs" / f"sha256-{part['sha256']}"
        if not (link.is_symlink() and Path(os.readlink(link)) == target):
            tmp = folder / f".{part['file']}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(target)
            os.replace(tmp, link)
    return folder / ref.parts[0]["file"]
