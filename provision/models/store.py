"""The model store: sha256-verified pulls with resume, a content-addressed cache, name refs.

Layout under ``paths.cache_root()/models`` (PROVISION_CACHE moves the root)::

    blobs/sha256-<hex>      verified GGUF bytes, read-only; a blob is only ever created by rename
    refs/<name>.json        name -> sha256, size, source, pin status
    partial/<key>.partial   a download in progress (key: expected sha256, or sha256 of the URL)
    partial/<key>.json      what the partial belongs to: URL, expected sha256, ETag/Last-Modified
    locks/<key>.lock        flock: one download per blob, however many pulls ask for it

A pull hashes bytes as they arrive (one pass, no re-read), keeps the partial file between
attempts and runs, resumes with ``Range`` + ``If-Range`` and promotes the file with fsync and
an atomic rename only when its size, sha256 and GGUF magic are right.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from provision.core import locks, outputs, paths
from provision.core import pins as pins_mod
from provision.core import settings as settings_mod
from provision.core.errors import (
    BadModelName,
    DiskFull,
    ModelHashMismatch,
    UnknownModel,
)
from provision.models import archive, names, splits, synth
from provision.models.download import Downloader, check_stall, stall_seconds
from provision.models.files import fsync_dir as _fsync_dir
from provision.models.files import has_magic as _has_magic
from provision.models.files import hash_file as _hash_file
from provision.models.files import write_json_atomic as _write_json_atomic
from provision.models.records import DamagedRef, DamagedRefError, Ref, load_ref
from provision.models.refs import ModelSpec, check_name, resolve

# The catalog's default for users (a real model, pinned but READ: its bytes were never
# downloaded by this project) and the built-in model for smoke runs and e2e tests (written
# locally, so the main CI job needs no network).
DEFAULT_MODEL = "qwen2.5-0.5b-instruct-q4_k_m"
SMOKE_MODEL = "tiny-llama"

def _is_name(name: str) -> bool:
    try:
        check_name(name)
    except BadModelName:
        return False
    return True


def catalog_names(pins: pins_mod.Pins | None = None) -> list[str]:
    return sorted((pins or pins_mod.default()).models)


@dataclass(frozen=True)
class PullResult:
    ref: Ref
    path: Path
    fetched_bytes: int  # bytes that came over the network in this call
    reused: bool  # the blob was already in the store


@dataclass(frozen=True)
class VerifyResult:
    name: str
    path: Path
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "ok": self.ok, "detail": self.detail}


class Store:
    def __init__(self, root: Path | None = None, pins: pins_mod.Pins | None = None, *,
                 out: TextIO | None = None, create: bool = True) -> None:
        self.root = root or paths.cache_dir("models")
        self.pins = pins or pins_mod.default()
        self.out = out if out is not None else sys.stderr
        if create:
            for sub in ("blobs", "refs", "partial", "locks"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)

    @classmethod
    def reading(cls, given: settings_mod.Settings | None = None) -> Store:
        """The settings' store for look-ups only (dry runs, completions): nothing made, not even its folder."""
        return cls((given or settings_mod.current()).typed.cache / "models", create=False)

    # --- layout -------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / f"sha256-{sha256}"

    def _ref_path(self, name: str) -> Path:
        return self.root / "refs" / f"{check_name(name)}.json"

    def _partial(self, key: str) -> tuple[Path, Path]:
        return self.root / "partial" / f"{key}.partial", self.root / "partial" / f"{key}.json"

    @contextlib.contextmanager
    def _locked(self, key: str, what: str) -> Iterator[None]:
        def waiting() -> None:
            self._say(f"{what}: waiting for another pull of the same model to finish")

        with locks.held(self.root / "locks" / f"{key}.lock", waiting=waiting):
            yield

    def _say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    # --- refs ---------------------------------------------------------------------------------

    def has_ref(self, name: str) -> bool:
        """A ref file of this name is there (sound or damaged)."""
        path = self._ref_path(name)
        return path.exists() or path.is_symlink()

    def ref(self, name: str) -> Ref | None:
        path = self._ref_path(name)
        if not (path.exists() or path.is_symlink()):
            return None
        try:
            return load_ref(path)
        except DamagedRefError as exc:
            raise ModelHashMismatch(
                f"{path}: damaged ref ({exc.reason})", fix=f"provision model rm {name}, then pull it again"
            ) from None

    def scan(self) -> tuple[list[Ref], list[DamagedRef]]:
        """Every ref in the store: the sound ones and the damaged ones (each still removable by name)."""
        good: list[Ref] = []
        damaged: list[DamagedRef] = []
        for path in sorted((self.root / "refs").glob("*.json")):
            if not _is_name(path.stem):
                continue  # not written by the store
            try:
                good.append(load_ref(path))
            except DamagedRefError as exc:
                damaged.append(DamagedRef(path.stem, path, exc.reason))
        return good, damaged

    def refs(self) -> list[Ref]:
        return self.scan()[0]

    def _write_ref(self, spec: ModelSpec, sha256: str, size: int, **more: Any) -> Ref:
        ref = Ref(spec.name, sha256, size, spec.source, spec.pinned, spec.pin_status, **more)
        _write_json_atomic(self._ref_path(spec.name), ref.as_dict())
        return ref

    def path(self, name: str) -> Path:
        """The file llama.cpp is given: the blob, or for a split model part 1 beside its siblings."""
        ref = self.ref(name)
        if ref is None or not all(self.blob_path(sha).exists() for sha, _ in ref.blobs()):
            pin = self.pins.models.get(name)
            again = f"{'synth' if pin and pin.synth else 'pull'} {name}"
            if ref is not None and pin is None:  # pulled from a reference: pull that again, not the name
                again = f"pull {ref.source} --name {name}"
            gone = "its file is missing from" if ref is not None else "is not in"
            raise UnknownModel(f"model {name!r}: {gone} the store {self.root}", fix=f"provision model {again}")
        return splits.link_parts(self.root, ref) if ref.parts else self.blob_path(ref.sha256)

    # --- pull ---------------------------------------------------------------------------------

    def resolve(self, arg: str, *, sha256: str | None = None, name: str | None = None) -> ModelSpec:
        return resolve(arg, self.pins, sha256=sha256, name=name, hf_endpoint=os.environ.get("HF_ENDPOINT") or None)

    def _blob_sound(self, sha256: str, size: int | None) -> bool:
        blob = self.blob_path(sha256)
        if size is not None and blob.stat().st_size != size:
            return False
        return _hash_file(blob)[0].hexdigest() == sha256 and _has_magic(blob)

    def _reusable(self, spec: ModelSpec) -> Ref | None:
        """The ref for ``spec`` when its blob is already here and re-hashes right. A damaged blob
        (edited, truncated, bit rot) is removed so the pull fetches it again."""
        try:
            known = self.ref(spec.name)
        except ModelHashMismatch:
            known = None  # a damaged ref of this name: the pull rewrites it
        if spec.sha256:
            sha256, size = spec.sha256, spec.size
            if size is None and known and known.sha256 == spec.sha256:
                size = known.size  # the size recorded when this name was first pulled
        elif known and known.source == spec.source:
            sha256, size = known.sha256, known.size
        else:
            return None
        if not self.blob_path(sha256).exists():
            return None
        if not self._blob_sound(sha256, size):
            self._say(f"{spec.name}: the stored blob sha256-{sha256} is damaged; fetching it again")
            self._drop_blob(sha256)
            return None
        if spec.sha256 is None:
            return known
        return self._write_ref(spec, sha256, self.blob_path(sha256).stat().st_size)

    def pull(self, spec: ModelSpec, *, stall_s: float | None = None) -> PullResult:
        if spec.synth:
            catalog_name = next(n for n, p in self.pins.models.items() if p.synth == spec.synth)
            return self.synth(catalog_name, as_name=spec.name)
        stall = stall_seconds() if stall_s is None else check_stall(stall_s, "--stall-timeout")
        if spec.archive:
            got, fetched, reused = archive.pull(self, spec, stall)
            return PullResult(got, self.path(got.name), fetched, reused)
        sha256, size, fetched, reused = self.fetch_blob(spec, stall, write_ref=True)
        ref = self.ref(spec.name)
        assert ref is not None
        return PullResult(ref, self.blob_path(sha256), fetched, reused)

    def fetch_blob(self, spec: ModelSpec, stall: float, *, write_ref: bool) -> tuple[str, int, int, bool]:
        """One verified blob for ``spec`` (reused when sound): sha256, size, bytes fetched, reused."""
        assert spec.url is not None
        if not spec.pinned:
            self._say(f"{spec.name}: no sha256 pinned for {spec.source}; the store will record the hash it computes")
        key = spec.sha256 or hashlib.sha256(spec.url.encode()).hexdigest()
        with self._locked(key, spec.name):
            # re-verified; another process may have finished it while we waited
            if spec.sha256 and self.blob_path(spec.sha256).exists() and not write_ref:
                if self._blob_sound(spec.sha256, spec.size):
                    return spec.sha256, self.blob_path(spec.sha256).stat().st_size, 0, True
                self._say(f"{spec.name}: the stored blob sha256-{spec.sha256} is damaged; fetching it again")
                self._drop_blob(spec.sha256)
            reused = self._reusable(spec) if write_ref else None
            if reused:
                return reused.sha256, reused.size, 0, True
            sha256, size, fetched = Downloader(self).download(spec, key, stall)
            if write_ref:
                self._write_ref(spec, sha256, size)
            return sha256, size, fetched, False
    def _install_blob(self, tmp: Path, sha256: str) -> Path:
        # Replace rather than keep an existing blob: these bytes were just verified, and a blob of
        # the right name but the wrong size (damaged by hand) is why _reusable() sent us here.
        blob = self.blob_path(sha256)
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
        _fsync_dir(blob.parent)
        return blob

    # --- synth --------------------------------------------------------------------------------

    def _synth_pin(self, name: str) -> pins_mod.ModelPin:
        pin = self.pins.models.get(check_name(name))
        if pin is None or not pin.synth:
            known = sorted(n for n, p in self.pins.models.items() if p.synth)
            raise UnknownModel(f"{name!r} is not a synthetic catalog model (known: {', '.join(known)})")
        return pin

    def _synth_into(self, name: str, path: Path) -> tuple[str, int]:
        """Write synthetic catalog model ``name`` to the fresh file ``path`` and check it against its pin."""
        pin = self._synth_pin(name)
        assert pin.synth is not None
        synth.check_versions(self.pins)
        write = synth.generator(pin.synth)
        with contextlib.redirect_stdout(sys.stderr):  # the gguf writer logs; stdout stays for reports
            write(path)
        hasher, size = _hash_file(path)
        sha256 = hasher.hexdigest()
        if (sha256, size) != (pin.sha256, pin.size):
            raise ModelHashMismatch(
                f"synth {name}: wrote {size} bytes with sha256 {sha256}, but {self.pins.path} models.{name} pins "
                f"{pin.size} bytes, sha256 {pin.sha256}; nothing was kept",
                fix="the generator or the gguf/numpy versions changed: fix them, or re-pin on purpose",
            )
        return sha256, size

    def synth_to(self, name: str, output: Path, *, force: bool = False) -> tuple[str, int]:
        """Write synthetic catalog model ``name`` to ``output`` (whole or not at all; an existing
        file is only replaced with ``force`` or when it already holds exactly these bytes)."""
        pin = self._synth_pin(name)
        result: list[tuple[str, int]] = []

        def same_model(path: Path) -> bool:
            if not path.is_file() or path.stat().st_size != pin.size:
                return False
            return _hash_file(path)[0].hexdigest() == pin.sha256

        outputs.write_file(
            output, lambda tmp: result.append(self._synth_into(name, tmp)), flag="--output", force=force,
            ours=same_model,
        )  # fmt: skip
        return result[0]

    def synth(self, name: str, *, as_name: str | None = None) -> PullResult:
        """Synthesize catalog model ``name`` into the store (under ``as_name`` when given)."""
        pin = self._synth_pin(name)
        spec = ModelSpec(
            check_name(as_name or name), f"synth:{pin.synth}", None, pin.sha256, pin.size, pin.status, pin.synth
        )
        with self._locked(pin.sha256, spec.name):
            reused = self._reusable(spec)
            if reused:
                return PullResult(reused, self.blob_path(reused.sha256), 0, True)
            tmp, _ = self._partial(f"synth-{name}.{os.getpid()}")
            try:
                sha256, size = self._synth_into(name, tmp)
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                self._install_blob(tmp, sha256)
            except OSError as exc:
                if outputs.is_disk_error(exc):
                    why = os.strerror(exc.errno) if exc.errno else f"short write ({exc})"
                    raise DiskFull(f"writing {tmp}: {why}; nothing was stored") from None
                raise
            finally:
                tmp.unlink(missing_ok=True)
            ref = self._write_ref(spec, sha256, size)
            return PullResult(ref, self.blob_path(sha256), 0, False)

    # --- verify, remove -----------------------------------------------------------------------

    def verify(self, name: str) -> VerifyResult:
        try:
            ref = self.ref(name)
        except ModelHashMismatch as exc:
            return VerifyResult(name, self._ref_path(name), False, exc.message)
        if ref is None:
            raise UnknownModel(f"model {name!r} is not in the store {self.root}", fix=f"provision model pull {name}")
        for sha256, want in ref.blobs() + ref.extra_blobs():
            blob = self.blob_path(sha256)
            if not blob.exists():
                return VerifyResult(name, blob, False, "blob missing")
            hasher, size = _hash_file(blob)
            if size != want:
                return VerifyResult(name, blob, False, f"{size} bytes, expected {want}")
            if hasher.hexdigest() != sha256:
                return VerifyResult(name, blob, False, f"sha256 {hasher.hexdigest()}, expected {sha256}")
            if (sha256, want) in ref.blobs() and not _has_magic(blob):
                return VerifyResult(name, blob, False, "no GGUF magic")
        parts = f", {len(ref.parts)} parts" if ref.parts else ""
        detail = f"sha256 {ref.sha256} ({sum(s for _, s in ref.blobs())} bytes{parts})"
        return VerifyResult(name, self.blob_path(ref.sha256), True, detail)

    def remove(self, name: str) -> Ref | DamagedRef:
        path = self._ref_path(name)
        try:
            ref = self.ref(name)
        except ModelHashMismatch:  # a damaged ref: remove the file; no blob can be attributed to it
            reason = next((d.reason for d in self.scan()[1] if d.name == name), "damaged")
            if path.is_dir() and not path.is_symlink():
                raise ModelHashMismatch(
                    f"{path} is a directory, not a ref; provision did not make it and leaves it alone",
                    fix=f"look inside, then remove it by hand: rm -r {path}",
                ) from None
            path.unlink()
            return DamagedRef(name, path, reason)
        if ref is None:
            raise UnknownModel(f"model {name!r} is not in the store {self.root}", fix="provision model list")
        with self._locked(ref.sha256, name):
            path.unlink()
            used = {sha for other in self.refs() for sha, _ in other.blobs() + other.extra_blobs()}
            for sha256, _size in ref.blobs() + ref.extra_blobs():
                if sha256 not in used:
                    self._drop_blob(sha256)
            if ref.parts:
                shutil.rmtree(self.root / "split" / name, ignore_errors=True)
        return ref

    def _drop_blob(self, sha256: str) -> None:
        blob = self.blob_path(sha256)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(blob, 0o644)
        blob.unlink(missing_ok=True)


def ensure(typed: str, *, out: TextIO | None = None) -> Path:
    """The verified blob of the model ``typed`` names (a store name, a short name, what was pulled:
    names.lookup), a catalog model pulled or synthesized when missing, re-hashed in any case."""
    store = Store(out=out)
    name = names.store_name(store, typed)
    if not store.has_ref(name):  # a catalog model not made yet
        if store.pins.models[name].synth:
            store.synth(name)
        else:
            store.pull(store.resolve(name))
    ref = store.ref(name)
    pin = store.pins.models.get(name)
    if ref is not None and pin is not None and ref.sha256 != pin.sha256:
        raise ModelHashMismatch(
            f"{name}: the store binds this catalog name to sha256 {ref.sha256}, but {store.pins.path} "
            f"models.{name} pins {pin.sha256}; the stored file is not the catalog's model",
            fix=f"provision model rm {name}, then provision model pull {name}",
        )
    result = store.verify(name)
    if not result.ok:
        raise ModelHashMismatch(
            f"{name}: stored blob {result.path}: {result.detail}", fix=f"provision model rm {name} and pull it again"
        )
    return store.path(name)  # a split model: part 1 beside its siblings
