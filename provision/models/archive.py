"""The GGUF inside an image layer: the tar (plain, gzip or zstd) read as one stream, nothing unpacked.

An image made for a model (RamaLama's "car" and "raw" images, any `FROM scratch` + `COPY model.gguf`)
holds the model as a regular file in a layer. RamaLama names that file `/models/NAME/NAME`, with no
`.gguf`, so a file is a model by its content: it starts with the GGUF magic. Only regular files are
read; links, devices and directories are skipped, and no member name ever becomes a path here (a
split part keeps its base name, checked like any split name). Each GGUF is copied to a file the
caller names while its sha256 is computed, in the same pass.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tarfile
import zlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from provision.core import outputs
from provision.core.errors import DiskFull, NotGguf, ToolMissing, UnknownModel
from provision.models.download import Downloader
from provision.models.download import Store as DownloadStore
from provision.models.files import GGUF_MAGIC
from provision.models.records import Ref
from provision.models.refs import ModelSpec
from provision.models.transports import check_split, split_name

CHUNK = 1 << 20


@dataclass(frozen=True)
class Found:
    member: str  # the file's name in the layer, for messages
    file: str | None  # a split part's name (what llama.cpp looks for beside part 1); None when not split
    path: Path  # where its bytes were copied
    sha256: str
    size: int


def _zstd_reader(raw: IO[bytes]) -> IO[bytes]:
    try:
        import zstandard
    except ImportError:
        raise ToolMissing(
            "the image layer is zstd-compressed; reading it needs the zstandard package",
            fix="pip install zstandard, or push the image with gzip layers (podman push --compression-format gzip)",
        ) from None
    reader: IO[bytes] = zstandard.ZstdDecompressor().stream_reader(raw)
    return reader


def ggufs(layer: Path, compression: str, into: Path, where: str) -> list[Found]:
    """Every GGUF file in the tar ``layer``, copied to files under ``into`` (the caller removes them)."""
    found: list[Found] = []
    try:
        with open(layer, "rb") as raw:
            stream: Any = _zstd_reader(raw) if compression == "zstd" else raw
            with tarfile.open(fileobj=stream, mode="r|gz" if compression == "gzip" else "r|") as tar:
                for member in tar:
                    if not member.isreg():
                        continue
                    src = tar.extractfile(member)
                    if src is None:
                        continue
                    head = src.read(len(GGUF_MAGIC))
                    if head != GGUF_MAGIC:
                        continue  # not a model (a README, a licence, a symlink's target elsewhere)
                    dest = into / f"{len(found)}.gguf"
                    with open(dest, "wb") as out:
                        out.write(head)
                    sha256, size = _copy_after(src, dest, head)
                    base = PurePosixPath(member.name).name
                    found.append(Found(member.name, split_name(base), dest, sha256, size))
    except (tarfile.TarError, zlib.error, EOFError) as exc:
        raise NotGguf(f"{where}: the layer is not a readable {compression} tar ({exc}); nothing stored",
                      fix="check the image: its last layer should hold the .gguf file") from None  # fmt: skip
    if not found:
        raise UnknownModel(
            f"{where}: the image's last layer holds no GGUF file; nothing stored",
            fix="copy the model into the image last (COPY model.gguf /models/), as RamaLama's images do",
        )
    return _one_model(found, where)


def _copy_after(src: IO[bytes], dest: Path, head: bytes) -> tuple[str, int]:
    """The rest of ``src`` appended to ``dest`` (which holds ``head``); sha256 and size of the whole."""
    hasher = hashlib.sha256(head)
    size = len(head)
    with open(dest, "ab") as out:
        while chunk := src.read(CHUNK):
            hasher.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return hasher.hexdigest(), size


_MMPROJ = re.compile(r"mmproj", re.I)
_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=,-]{0,199}$")  # what a stored ref accepts for a part's file


def _one_model(found: list[Found], where: str) -> list[Found]:
    """One model: a single GGUF, or every part of one split GGUF in order. A projector (mmproj) beside
    the model is left out, as a hub pull leaves it out."""
    models = [f for f in found if not _MMPROJ.search(f.member)] or found
    if len(models) == 1:
        return models
    parts = sorted((f for f in models if f.file), key=lambda f: str(f.file))
    if len(parts) == len(models):
        check_split([str(f.file) for f in parts], where)
        for part in parts:  # the name becomes a file beside part 1: nothing a path would read otherwise
            if not _PART.match(str(part.file)):
                raise UnknownModel(
                    f"{where}: split part name {part.file!r} has characters a file name here may not",
                    fix="rename the parts NAME-0000K-of-0000N.gguf, of letters, digits and . _ -",
                )
        return parts
    raise UnknownModel(
        f"{where}: the layer holds {len(models)} GGUF files ({', '.join(f.member for f in models)}); "
        "which one is the model is not clear",
        fix="push an image with one model in it (or the parts of one split model)",
    )


class Store(DownloadStore, Protocol):
    """What reading a model out of a layer needs of the store (provision/models/store.py), which calls it."""

    root: Path

    def _locked(self, key: str, what: str) -> AbstractContextManager[None]: ...

    def _write_ref(self, spec: ModelSpec, sha256: str, size: int, **more: Any) -> Ref: ...

    def _blob_sound(self, sha256: str, size: int | None) -> bool: ...

    def blob_path(self, sha256: str) -> Path: ...

    def scan(self) -> tuple[list[Ref], Any]: ...


def _already(store: Store, spec: ModelSpec, key: str) -> Ref | None:
    """This name's ref when it was read out of this very layer and its blobs re-hash right."""
    known = next((r for r in store.scan()[0] if r.name == spec.name), None)
    if known is None or known.layer != key or known.source != spec.source:
        return None
    sound = all(store.blob_path(sha).exists() and store._blob_sound(sha, size) for sha, size in known.blobs())
    return known if sound else None


def pull(store: Store, spec: ModelSpec, stall: float) -> tuple[Ref, int, bool]:
    """The GGUF in an image layer: the layer fetched and checked against its digest (resumable like
    any pull), the GGUF read out of it into a blob of its own sha256, the layer dropped. The ref, the
    bytes fetched, and whether the store already held it (read out of the same layer)."""
    assert spec.url is not None and spec.sha256 is not None and spec.archive is not None
    key = spec.sha256
    layer = store.root / "partial" / f"{key}.layer"
    work = store.root / "partial" / f"{key}.unpack.{os.getpid()}"
    with store._locked(key, spec.name):
        known = _already(store, spec, key)
        if known is not None:
            return known, 0, True
        try:
            _sha, _size, fetched = Downloader(store, keep_at=layer).download(spec, key, stall)
            work.mkdir(exist_ok=True)
            store._say(f"{spec.name}: layer sha256 {key} checked; reading the GGUF out of it")
            try:
                found = ggufs(layer, spec.archive, work, spec.source)
            except OSError as exc:
                if outputs.is_disk_error(exc):
                    raise DiskFull(f"reading the GGUF out of {layer}: {os.strerror(exc.errno or 0)}; "
                                   "nothing was stored") from None  # fmt: skip
                raise
            for gguf in found:
                store._install_blob(gguf.path, gguf.sha256)
        finally:
            layer.unlink(missing_ok=True)
            shutil.rmtree(work, ignore_errors=True)
        parts = [{"sha256": g.sha256, "size": g.size, "file": g.file} for g in found] if len(found) > 1 else None
        return store._write_ref(spec, found[0].sha256, found[0].size, parts=parts, layer=key), fetched, False
