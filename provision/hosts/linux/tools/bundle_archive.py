"""A host-tools bundle as a file: a compressed tar with a manifest of every file's sha256.

The compression follows the name when packing (``.tar.zst`` by default; ``.tar.xz`` and
``.tar.gz`` are written by Python alone) and the file's first bytes when installing, so a
target without a ``zstd`` program (Ubuntu's minimal images) installs a ``.tar.xz`` or
``.tar.gz`` with Python's tarfile only; only a zstd bundle needs the ``zstd`` program there.

Installing unpacks into a temporary directory beside the destination, refuses links and
paths that leave it, checks every file against the manifest, and only then renames the
directory into place: a damaged or partial bundle never becomes the host tools.
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
import tarfile
from pathlib import Path, PurePosixPath

from provision.adapters import runner
from provision.core.errors import HostToolsMissing, InvalidValue
from provision.core.paths import cache_dir
from provision.images.sources import sha256_file

MANIFEST = "bundle.json"
FORMAT = 1

# How each compression starts (its magic number) and the tarfile stream mode Python reads it
# with; zstd has none before Python 3.14, so it goes through the program.
_MAGIC = {b"\x28\xb5\x2f\xfd": "zst", b"\xfd7zXZ\x00": "xz", b"\x1f\x8b": "gz"}
SUFFIXES = {".tar.zst": "zst", ".tar.xz": "xz", ".tar.gz": "gz", ".tgz": "gz"}


def is_bundle(root: Path) -> bool:
    return (root / MANIFEST).is_file()


def hashes(top: Path) -> dict[str, str]:
    files = (p for p in sorted(top.rglob("*")) if p.is_file() and p.name != MANIFEST)
    return {str(p.relative_to(top)): sha256_file(p) for p in files}


def tree_bytes(top: Path) -> int:
    """The bytes of the regular files under ``top`` (an installed bundle's size)."""
    return sum(p.stat().st_size for p in top.rglob("*") if p.is_file() and not p.is_symlink())


def compression_for(dest: Path) -> str:
    """The compression a bundle named ``dest`` is written with, from its suffix."""
    for suffix, kind in SUFFIXES.items():
        if dest.name.endswith(suffix) and len(dest.name) > len(suffix):
            return kind
    raise InvalidValue(
        f"{dest.name!r} does not name a bundle archive (known endings: {', '.join(SUFFIXES)})",
        fix=f"name the --bundle file like {dest.name or 'host-tools'}.tar.xz (no zstd needed where it is installed)",
    )


def _add_files(tar: tarfile.TarFile, staged: Path) -> None:
    for p in sorted(staged.rglob("*")):
        if p.is_file():
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(staged)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with p.open("rb") as f:
                tar.addfile(info, f)


def pack(staged: Path, dest: Path, *, level: int = 10) -> None:
    """``staged`` as a compressed tar at ``dest`` (written beside it, then renamed); ``level``
    applies to zstd (1-19) and is mapped onto xz's and gzip's 0-9."""
    kind = compression_for(dest)
    partial = dest.with_name(dest.name + ".partial")
    try:
        if kind == "zst":
            _pack_zstd(staged, partial, dest, level)
        elif kind == "xz" and runner.found("xz"):
            # xz -T0 uses every core: a bundle with guests is ~300 MB of input, minutes on one core.
            _pack_pipe(["xz", "-q", "-T0", f"-{min(level, 9)}", "-c"], staged, partial, dest)
        elif kind == "xz":
            with lzma.open(partial, "wb", preset=min(level, 9)) as sink, \
                    tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_files(tar, staged)
        else:
            with gzip.open(partial, "wb", compresslevel=min(level, 9)) as gz_sink, \
                    tarfile.open(fileobj=gz_sink, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_files(tar, staged)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(dest)


def _pack_zstd(staged: Path, partial: Path, dest: Path, level: int) -> None:
    if runner.found("zstd") is None:
        raise HostToolsMissing(
            "zstd is not installed", fix=f"apt-get install zstd, or name the bundle {dest.stem}.xz (no zstd needed)"
        )
    _pack_pipe(["zstd", "-q", "-T0", f"-{level}", "--long=27", "-c"], staged, partial, dest)


def _pack_pipe(compressor: list[str], staged: Path, partial: Path, dest: Path) -> None:
    with partial.open("wb") as sink:
        # On the owned process tree: a killed provision takes its compressor with it.
        with runner.start(compressor, compressor[0], stdin=runner.PIPE, stdout=sink) as proc:
            assert proc.stdin is not None
            with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                _add_files(tar, staged)
            proc.stdin.close()
            proc.wait()
        if proc.returncode != 0:
            raise HostToolsMissing(
                f"{compressor[0]} failed writing {dest}", fix=f"check the free space where {dest} goes"
            )


def default_install_dir() -> Path:
    return cache_dir("host-tools") / "bundle"


def install(archive: Path, dest: Path | None = None) -> Path:
    """Unpack ``archive`` beside ``dest``, verify every file against its manifest, rename into place."""
    dest = dest or default_install_dir()
    if not archive.is_file():
        raise HostToolsMissing(
            f"{archive} is not a file",
            fix="pass the file that `provision host-tools --bundle OUT.tar.zst` (or OUT.tar.xz, OUT.tar.gz) wrote",
        )
    kind = sniff(archive)
    if kind == "zst" and runner.found("zstd") is None:
        raise HostToolsMissing(
            f"{archive} is zstd-compressed and this host has no zstd program",
            fix="install zstd (Debian/Ubuntu: apt-get install zstd), or make the bundle as OUT.tar.xz or OUT.tar.gz, "
            "which Python unpacks alone",
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.unpacking-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _unpack(archive, tmp, kind)
        _verify(tmp, archive)
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def sniff(archive: Path) -> str:
    """The compression of ``archive``, from its first bytes (not its name, which may lie)."""
    with archive.open("rb") as f:
        head = f.read(6)
    for magic, kind in _MAGIC.items():
        if head.startswith(magic):
            return kind
    raise HostToolsMissing(
        f"{archive} is not a bundle: not zstd, xz or gzip data",
        fix="pass the OUT.tar.zst, OUT.tar.xz or OUT.tar.gz made by `provision host-tools --bundle`",
    )


def _unpack(archive: Path, into: Path, kind: str) -> None:
    if kind != "zst":
        try:
            with (tarfile.open(archive, mode="r|xz") if kind == "xz" else tarfile.open(archive, mode="r|gz")) as tar:
                bad = _extract_regular_files(tar, into)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise HostToolsMissing(
                f"{archive} is not a bundle: {exc}", fix="copy the bundle again or make it again with --bundle"
            ) from None
        _refuse(archive, bad)
        return
    proc = runner.start(["zstd", "-q", "-d", "-c", "--long=27", str(archive)], "zstd", stdout=runner.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            bad = _extract_regular_files(tar, into)
    except tarfile.TarError as exc:
        raise HostToolsMissing(
            f"{archive} is not a bundle: {exc}", fix="make it again with `provision host-tools --bundle`"
        ) from None
    finally:
        proc.stdout.close()
        proc.wait()
        proc.finish()
    if proc.returncode != 0:
        raise HostToolsMissing(f"zstd could not read {archive}", fix="copy the bundle again; it is damaged")
    _refuse(archive, bad)


def _extract_regular_files(tar: tarfile.TarFile, into: Path) -> list[str]:
    """Write each regular file under ``into``; return the names of every other entry (links,
    devices, directories with absolute or '..' names, absolute or '..' paths), written nowhere.
    No link is ever made, so nothing written can point or resolve outside ``into``."""
    bad: list[str] = []
    for member in tar:
        name = PurePosixPath(member.name)
        if not member.isfile() or name.is_absolute() or ".." in name.parts or not name.parts:
            bad.append(member.name)
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(member)
        assert src is not None
        with target.open("wb") as f:
            shutil.copyfileobj(src, f)
        target.chmod(0o755 if member.mode & 0o100 else 0o644)
    return bad


def _refuse(archive: Path, bad: list[str]) -> None:
    if bad:
        raise HostToolsMissing(
            f"{archive} holds {len(bad)} entries a bundle never has (links, devices, absolute or '..' paths): "
            + ", ".join(bad[:10]) + (", ..." if len(bad) > 10 else ""),
            fix="use a bundle made by `provision host-tools --bundle`",
        )


def _verify(top: Path, archive: Path) -> None:
    try:
        manifest = json.loads((top / MANIFEST).read_text())
    except (OSError, ValueError):
        raise HostToolsMissing(
            f"{archive} has no readable {MANIFEST}", fix="make it again with `provision host-tools --bundle`"
        ) from None
    if manifest.get("format") != FORMAT:
        raise HostToolsMissing(
            f"{archive} is bundle format {manifest.get('format')}, this provision reads {FORMAT}",
            fix="make the bundle with the same provision version",
        )
    want: dict[str, str] = manifest["files"]
    have = hashes(top)
    wrong = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
    if wrong:
        raise HostToolsMissing(
            f"{archive} does not match its manifest ({len(wrong)} files differ, are missing or extra: "
            + ", ".join(wrong[:5]),
            fix="copy the bundle again; it is damaged",
        )
