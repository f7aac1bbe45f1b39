"""A host-tools bundle as a file: a zstd tar with a manifest of every file's sha256.

Installing unpacks into a temporary directory beside the destination, refuses links and
paths that leave it, checks every file against the manifest, and only then renames the
directory into place: a damaged or partial bundle never becomes the host tools.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path, PurePosixPath

from provision.core.errors import HostToolsMissing
from provision.core.paths import cache_dir

MANIFEST = "bundle.json"
FORMAT = 1


def is_bundle(root: Path) -> bool:
    return (root / MANIFEST).is_file()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hashes(top: Path) -> dict[str, str]:
    return {str(p.relative_to(top)): _sha256(p) for p in sorted(top.rglob("*")) if p.is_file() and p.name != MANIFEST}


def pack(staged: Path, dest: Path, *, level: int = 10) -> None:
    """``staged`` as a zstd-compressed tar at ``dest`` (written beside it, then renamed)."""
    if shutil.which("zstd") is None:
        raise HostToolsMissing("zstd is not installed", fix="apt-get install zstd (scripts/setup-debian does)")
    partial = dest.with_name(dest.name + ".partial")
    with partial.open("wb") as sink:
        proc = subprocess.Popen(
            ["zstd", "-q", "-T0", f"-{level}", "--long=27", "-c"], stdin=subprocess.PIPE, stdout=sink
        )
        assert proc.stdin is not None
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for p in sorted(staged.rglob("*")):
                if p.is_file():
                    info = tar.gettarinfo(str(p), arcname=str(p.relative_to(staged)))
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with p.open("rb") as f:
                        tar.addfile(info, f)
        proc.stdin.close()
        if proc.wait() != 0:
            raise HostToolsMissing(f"zstd failed writing {dest}", fix="check the free space where OUT.tar.zst goes")
    partial.rename(dest)


def default_install_dir() -> Path:
    return cache_dir("host-tools") / "bundle"


def install(archive: Path, dest: Path | None = None) -> Path:
    """Unpack ``archive`` beside ``dest``, verify every file against its manifest, rename into place."""
    dest = dest or default_install_dir()
    if not archive.is_file():
        raise HostToolsMissing(
            f"{archive} is not a file", fix="pass the OUT.tar.zst made by `provision host-tools --bundle`"
        )
    if shutil.which("zstd") is None:
        raise HostToolsMissing("zstd is not installed", fix="install zstd (Debian/Ubuntu: apt-get install zstd)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.unpacking-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _unpack(archive, tmp)
        _verify(tmp, archive)
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        if dest.exists():
            dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _unpack(archive: Path, into: Path) -> None:
    proc = subprocess.Popen(["zstd", "-q", "-d", "-c", "--long=27", str(archive)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    bad: list[str] = []
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if not member.isfile() or name.is_absolute() or ".." in name.parts:
                    bad.append(member.name)
                    continue
                target = into / name
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with target.open("wb") as f:
                    shutil.copyfileobj(src, f)
                target.chmod(0o755 if member.mode & 0o100 else 0o644)
    except tarfile.TarError as exc:
        raise HostToolsMissing(
            f"{archive} is not a bundle: {exc}", fix="make it again with `provision host-tools --bundle`"
        ) from None
    finally:
        proc.stdout.close()
        proc.wait()
    if proc.returncode != 0:
        raise HostToolsMissing(f"zstd could not read {archive}", fix="copy the bundle again; it is damaged")
    if bad:
        raise HostToolsMissing(
            f"{archive} holds entries a bundle never has (links, absolute or '..' paths): {', '.join(bad[:5])}",
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
