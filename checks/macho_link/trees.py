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

from . import toolchain

REPO = Path(__file__).resolve().parents[2]
PINS = REPO / "provision" / "data" / "pins.json"
FACTS = REPO / "nix" / "facts" / "upstream.json"
UPSTREAM = REPO.parent / "shared" / "upstream"


class TreeError(Exception):
    pass


# What nixpkgs' meson setup hook passes unless a recipe says otherwise; our recipe states each
# (nix/pkgs/virglrenderer-apir.nix: mesonBuildType, mesonAutoFeatures, mesonWrapMode) and
# tests/nix compares them with `nix eval`. (plain does not keep assert() live here: with the trees'
# b_ndebug=if-release, meson defines NDEBUG for plain as for release; the result says which.)
# b_lundef=true is meson's own default (the hook turns it off only on FreeBSD); zig's linker
# honours the -Wl,--no-undefined it stands for, so an undefined symbol fails the link.
NIX_MESON_OPTIONS = ("--buildtype=plain", "-Dauto_features=enabled", "--wrap-mode=nodownload", "-Db_lundef=true")

# The recipe's postPatch points patch 0003's bare "libMoltenVK.dylib" at the store MoltenVK
# (nix/lib/virglrenderer.nix moltenvkDlopenRule); the check makes the same substitution, failing
# as --replace-fail does when the text is gone, with a store-shaped path (MoltenVK is dlopened,
# never linked, so no file need be there).
MOLTENVK_RULE = ("src/venus/vkr_library.c", '"libMoltenVK.dylib"')


def moltenvk_standin() -> str:
    version = pins()["moltenvk"]["version"]
    return f"/nix/store/{'0' * 32}-moltenvk-{version}/lib/libMoltenVK.dylib"


@dataclass(frozen=True)
class DarwinTree:
    """A virglrenderer tree of the macOS bundle and the meson flags of its Nix recipe on aarch64-darwin
    (tests/nix/test_nix_flake.py compares them with `nix eval` of the recipe). Every default target
    is built, as Nix builds them; `library` is the one judged against libkrun's calls.
    `patches` None means the pin's own list (the series as pins.json names it)."""

    pin: str
    meson_flags: tuple[str, ...]
    library: str = "src/libvirglrenderer.1.dylib"
    header: str = "src/virglrenderer.h"
    moltenvk_rule: tuple[str, str] | None = None
    patches: tuple[str, ...] | None = None

    def patch_list(self, pin: dict[str, Any]) -> list[str]:
        return list(self.patches) if self.patches is not None else list(pin.get("patches", []))


APIR_DARWIN_FLAGS = ("-Dvenus=true", "-Dapir=true", "-Dvulkan-dload=true")
# Our darwin tree as it stood before the in-process series (issue 39): the build fix, libkrun's blob
# ABI, MoltenVK first. Named so the check can keep showing what that tree does on macOS.
SERIES_BEFORE_IN_PROCESS = (
    "patches/virglrenderer/darwin/0001-darwin-build-on-macos.patch",
    "patches/virglrenderer/darwin/0002-darwin-libkrun-blob-abi.patch",
    "patches/virglrenderer/darwin/0003-darwin-moltenvk-first.patch",
)

# Every darwin virglrenderer we pin or patch. virglrenderer-apir-darwin (CamouflageNetworks) is the
# tree both Mac routes used before: kept pinned so the check can show it does not link.
DARWIN_TREES = {
    "virglrenderer-apir-macos": DarwinTree("virglrenderer-apir-macos", APIR_DARWIN_FLAGS, moltenvk_rule=MOLTENVK_RULE),
    "virglrenderer-apir-macos-0001-0003": DarwinTree(
        "virglrenderer-apir-macos", APIR_DARWIN_FLAGS, moltenvk_rule=MOLTENVK_RULE, patches=SERIES_BEFORE_IN_PROCESS
    ),
    "virglrenderer-apir-darwin": DarwinTree("virglrenderer-apir-darwin", APIR_DARWIN_FLAGS),
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


def substitute(tree: Path, rule: tuple[str, str], to: str, log: Path) -> None:
    """Nix's `substituteInPlace FILE --replace-fail FROM TO`: every occurrence, an error when none."""
    rel, old = rule
    path = tree / rel
    text = path.read_text() if path.is_file() else ""
    if old not in text:
        raise TreeError(
            f"{rel}: no {old} to replace (the recipe's postPatch would fail the same way)\n"
            "fix: keep patch 0003's dlopen name, or change nix/lib/virglrenderer.nix moltenvkDlopenRule with it"
        )
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.replace(old, '"' + to + '"'))
    tmp.replace(path)
    with log.open("a") as out:
        out.write(f"$ substituteInPlace {rel} --replace-fail {old} {to!r}\n")


# Bump when a change to this check changes what a build or its judgement is (ggml's key reads it too).
CHECK_VERSION = 1
# The virglrenderer check's own: 2 = every default target, the Nix meson options, the MoltenVK rule.
VIRGL_CHECK_VERSION = 4


def cache_key(tree: DarwinTree, pin: dict[str, Any], extra: str) -> str:
    """Everything a virglrenderer result depends on: the pin, the patches applied (their bytes),
    the flags, the meson options, the MoltenVK rule and its path, zig and the stand-ins (`extra`).
    Two names with the same inputs share one build."""
    patches = tree.patch_list(pin)
    inputs = {
        "v": VIRGL_CHECK_VERSION,
        "pin": pin,
        "flags": tree.meson_flags,
        "options": NIX_MESON_OPTIONS,
        "library": tree.library,
        "header": tree.header,
        "rule": tree.moltenvk_rule,
        "moltenvk": moltenvk_standin() if tree.moltenvk_rule else None,
        "patches": patches,
        "extra": extra,
        "header_gaps": toolchain.SDK_HEADER_GAPS,
    }
    h = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode())
    for rel in patches:
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
