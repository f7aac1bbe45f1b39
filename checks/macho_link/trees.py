"""A pinned darwin tree from ../shared/upstream: unpacked, checked against its NAR hash, patched."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / "provision" / "data" / "pins.json"
FACTS = REPO / "nix" / "facts" / "upstream.json"
UPSTREAM = REPO.parent / "shared" / "upstream"


class TreeError(Exception):
    pass


@dataclass(frozen=True)
class DarwinTree:
    """A virglrenderer tree of the macOS bundle and the meson flags of its Nix recipe on aarch64-darwin
    (tests/nix/test_macho_link.py compares them with `nix eval` of the recipe)."""

    pin: str
    meson_flags: tuple[str, ...]
    target: str = "src/libvirglrenderer.1.dylib"
    header: str = "src/virglrenderer.h"


# Every darwin virglrenderer we pin or patch. virglrenderer-apir-darwin (CamouflageNetworks) is the
# tree both Mac routes used before: kept pinned so the check can show it does not link.
DARWIN_TREES = {
    "virglrenderer-apir-macos": DarwinTree(
        "virglrenderer-apir-macos", ("-Dvenus=true", "-Dapir=true", "-Dvulkan-dload=true")
    ),
    "virglrenderer-apir-darwin": DarwinTree(
        "virglrenderer-apir-darwin", ("-Dvenus=true", "-Dapir=true", "-Dvulkan-dload=true")
    ),
}


def pins() -> dict[str, Any]:
    return json.loads(PINS.read_text())["sources"]


def pin_of(name: str) -> dict[str, Any]:
    sources = pins()
    if name not in sources:
        raise TreeError(f"no pin {name!r}\nfix: provision/data/pins.json, sources.{name}")
    return sources[name]


def nar_hash(path: Path) -> str:
    """The tree's NAR hash, as provision checks every pinned tree (provision/adapters/nix.py)."""
    from provision.adapters import nix
    from provision.core.errors import ProvisionError

    try:
        return nix.hash_path(path)
    except ProvisionError as exc:
        raise TreeError(f"{exc.message}\nfix: {exc.fix}") from None


def unpack(tarball: Path, dest: Path, expected_nar: str) -> Path:
    """The tarball's one folder under dest, refused unless its NAR hash is the pin's."""
    if not tarball.is_file():
        raise TreeError(f"{tarball} missing\nfix: pass --upstream DIR holding the pinned tarballs (../shared/upstream)")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
        if len(tops) != 1:
            raise TreeError(f"{tarball.name}: expected one top folder, found {sorted(tops)[:5]}")
        tar.extractall(dest, filter="data")
    tree = dest / tops.pop()
    got = nar_hash(tree)
    if got != expected_nar:
        shutil.rmtree(tree)
        raise TreeError(
            f"{tarball.name}: NAR hash {got} is not the pin's {expected_nar}; refused\n"
            "fix: use the tarball named in provision/data/pins.json (upstream_tarball), unmodified"
        )
    return tree


def apply_patches(tree: Path, patches: list[str], log: Path) -> list[str]:
    applied = []
    for rel in patches:
        patch = REPO / rel
        with log.open("ab") as out:
            out.write(f"$ patch -p1 --fuzz=0 < {rel}\n".encode())
            out.flush()
            proc = subprocess.run(
                ["patch", "-p1", "--fuzz=0", "--forward", "--no-backup-if-mismatch", "-i", str(patch)],
                cwd=tree,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if proc.returncode != 0:
            raise TreeError(f"{rel} does not apply to {tree.name} (see {log})\nfix: rebase the patch on the pinned rev")
        applied.append(rel)
    return applied


# Bump when a change to this check changes what a build or its judgement is.
CHECK_VERSION = 1


def cache_key(tree: DarwinTree, pin: dict[str, Any], extra: str) -> str:
    h = hashlib.sha256(
        json.dumps({"v": CHECK_VERSION, "tree": tree.__dict__, "pin": pin, "extra": extra}, sort_keys=True).encode()
    )
    for rel in pin.get("patches", []):
        h.update((REPO / rel).read_bytes())
    return h.hexdigest()[:20]


def cached_result(cache: Path, stem: str, fresh: bool, run: Callable[[Path, Path], dict[str, Any]]) -> dict[str, Any]:
    """``cache/<stem>.json`` when it is there (and not ``fresh``); else ``run(work, log)`` in a
    scratch folder, its result written whole (temp name, then rename) with the log beside it."""
    cache.mkdir(parents=True, exist_ok=True)
    record = cache / f"{stem}.json"
    if record.exists() and not fresh:
        cached: dict[str, Any] = json.loads(record.read_text())
        cached["cached"] = True
        return cached
    work = Path(tempfile.mkdtemp(prefix=f"{stem}-", dir=cache))
    log = cache / f"{stem}.log"
    log.write_text("")
    try:
        result = run(work, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["log"] = str(log)
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    tmp.replace(record)
    result["cached"] = False
    return result
