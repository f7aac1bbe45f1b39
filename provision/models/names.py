"""What a user typed for a model, to the name the store keeps it under: one lookup for every command.

`model path|inspect|rm|verify` and `--model` of run, serve, bench, perplexity and image build all
go through ``lookup()``, so whatever a pull accepted names the model afterwards: the store name
itself, a short name (the model its reference pulled), NAME:TAG or any registry reference
(``kquant:latest`` and ``ollama://HOST/kquant:latest`` both find ``kquant-latest``), hf.co/,
hf:// or a URL (the stored model whose source it is, whatever --name it was pulled under), and a
bare ollama NAME for NAME:latest. No network: only the short names, the catalog and the refs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol
from urllib.parse import unquote, urlsplit

from provision.core.errors import BadModelName, InvalidValue, UnknownModel
from provision.core.pins import Pins
from provision.core.suggest import did_you_mean
from provision.models import shortnames, transports
from provision.models.records import DamagedRef, Ref
from provision.models.refs import check_name, check_url, parse_hf
from provision.models.transports import HfRepoRef, RegistryRef


class Store(Protocol):
    """What a look-up reads of the store (provision/models/store.py): its refs and the catalog."""

    root: Path
    pins: Pins

    def has_ref(self, name: str) -> bool: ...

    def scan(self) -> tuple[list[Ref], list[DamagedRef]]: ...


_TYPED_FIX = (
    "give a name from `provision model list`, or what you pulled: a short name, NAME:TAG, ollama://, oci://, "
    "docker://, hf.co/ORG/REPO[:QUANT], hf://… or the URL"
)


@dataclass(frozen=True)
class Lookup:
    typed: str
    means: str  # after short names
    name: str | None  # the store name that holds it; None: nothing stored matches
    catalog: str | None  # the catalog model it names (a pull or synth can make it), if any

    def missing(self, root: object, known: Iterable[str] = ()) -> UnknownModel:
        """E010 for a model that is not stored, with a fix that makes it (never a step already done); a
        plain name nobody pulled gets the ``known`` names nearest to it first."""
        means = f" ({self.typed} is {self.means})" if self.means != self.typed else ""
        if self.catalog is not None:
            return UnknownModel(f"model {self.typed!r}{means} is not in the store {root}",
                                fix=f"provision model pull {self.typed}")  # fmt: skip
        if _is_name(self.means) and _parse(self.means) is None:  # a plain name nobody pulled
            hint = did_you_mean(self.typed, known)
            return UnknownModel(
                f"model {self.typed!r}{means} is neither in the store {root} nor in the catalog",
                fix=(f"{hint} " if hint else "") + "`provision model list` shows the names there are; pull a "
                "reference or URL first (provision model pull REF)",
            )
        return UnknownModel(f"model {self.typed!r}{means} is not in the store {root}; it was never pulled",
                            fix=f"provision model pull {self.typed}")  # fmt: skip


def _is_name(text: str) -> bool:
    try:
        check_name(text)
    except BadModelName:
        return False
    return True


def _parse(text: str) -> RegistryRef | HfRepoRef | None:
    try:
        return transports.parse(text)
    except BadModelName:
        return None


def _stem(path: str) -> str:
    name = PurePosixPath(unquote(path)).name
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def _key(reference: str) -> tuple[str, ...] | None:
    """What identifies a reference regardless of how it was spelled; None for a plain name."""
    if reference.startswith("hf://"):
        try:
            hf = parse_hf(reference)
        except BadModelName:
            return None
        return ("hf", hf.repo_id, hf.filename, hf.revision or "main")
    parsed = _parse(reference)
    if isinstance(parsed, RegistryRef):
        return ("registry", parsed.repository, parsed.reference)
    if isinstance(parsed, HfRepoRef):
        return ("hf.co", parsed.repo_id, (parsed.quant or transports.DEFAULT_QUANT).upper())
    if "://" in reference:
        return ("url", reference)
    return None


def is_reference(text: str) -> bool:
    """``text`` reads as a model reference (NAME:TAG, ollama://, hf.co/ORG/REPO, hf://, a URL), not a path."""
    return "://" in text or _key(text) is not None


def _registry(reference: str) -> str | None:
    parsed = _parse(reference)
    return parsed.registry if isinstance(parsed, RegistryRef) else None


def _same_source(typed: str, source: str) -> bool:
    """The stored model's source is the reference typed; a registry reference that names no registry
    matches the same repository and tag from any registry (that is where its default sent it)."""
    key = _key(typed)
    if key is None or key != _key(source):
        return False
    want = _registry(typed)
    return want is None or want == _registry(source)


def _derived_name(reference: str) -> str | None:
    """The name a pull of ``reference`` without --name stores it under, where that follows from the text."""
    parsed = _parse(reference)
    if isinstance(parsed, RegistryRef):
        name = parsed.stem.replace(":", "-")
    elif reference.startswith("hf://"):
        try:
            name = _stem(parse_hf(reference).filename)
        except BadModelName:
            return None
    elif "://" in reference:
        try:
            name = _stem(urlsplit(reference).path)
        except ValueError:
            return None
    else:
        return None
    return name if _is_name(name) else None


def _from_registry(store: Store, name: str, registry: str | None) -> bool:
    """The stored ``name`` may stand for a reference to ``registry`` (None: any, the default's)."""
    if registry is None:
        return True
    ref = next((r for r in store.scan()[0] if r.name == name), None)
    return ref is not None and _registry(ref.source) == registry


def lookup(store: Store, typed: str) -> Lookup:
    """Where ``typed`` is in the store (or None), and which catalog model it names. E014 when it is
    neither a name nor a reference a pull would take."""
    exists = store.has_ref
    if _is_name(typed) and exists(typed):  # a damaged ref too: path/verify/rm say what is wrong with it
        return Lookup(typed, typed, typed, typed if typed in store.pins.models else None)
    means = shortnames.expand(typed)
    catalog = means if means in store.pins.models else None
    if means.startswith("hf://"):
        try:
            hf = parse_hf(means)
        except BadModelName:
            hf = None
        catalog = next((n for n, p in store.pins.models.items() if hf and p.hf and parse_hf(p.hf) == hf), catalog)
    if not _is_name(means):  # a reference, checked as a pull checks it (E014 or E003 naming what is wrong)
        if means.startswith("hf://"):
            parse_hf(means)
        elif transports.parse(means) is None:
            if "://" not in means:
                raise BadModelName(f"model {typed!r}: not a store name nor a reference", fix=_TYPED_FIX)
            check_url(means)
    for candidate in (means, catalog):
        if candidate and _is_name(candidate) and exists(candidate):
            return Lookup(typed, means, candidate, catalog)
    wants = [means]
    if _is_name(means) and ":" not in means and catalog is None:
        wants.append(f"{means}:latest")  # what ollama means by a bare NAME
    good, _damaged = store.scan()
    for want in wants:
        derived = _derived_name(want)
        matches = sorted({ref.name for ref in good if _same_source(want, ref.source)})
        if len(matches) > 1 and derived in matches:
            matches = [derived]
        if len(matches) > 1:
            raise InvalidValue(
                f"model {typed!r} was pulled under {len(matches)} names: {', '.join(matches)}",
                fix=f"name the one you mean: provision model path {matches[0]}",
            )
        if matches:
            return Lookup(typed, means, matches[0], catalog)
        if derived and exists(derived) and _from_registry(store, derived, _registry(want)):
            return Lookup(typed, means, derived, catalog)
    return Lookup(typed, means, None, catalog)


def stored(store: Store, typed: str) -> str:
    """The store name of what ``typed`` names; E010 (with a fix that makes it) when nothing stored matches."""
    found = lookup(store, typed)
    if found.name is None:
        raise found.missing(store.root, known_names(store))
    return found.name


def store_name(store: Store, typed: str) -> str:
    """The name ``typed`` is (or, for a catalog model not yet made, will be) stored under; E010 otherwise."""
    found = lookup(store, typed)
    name = found.name or found.catalog
    if name is None:
        raise found.missing(store.root, known_names(store))
    return name


def known_names(store: Store) -> list[str]:
    """Every name a user can type for a model without a reference: stored, catalog and short names."""
    good, _damaged = store.scan()
    return sorted({ref.name for ref in good} | set(store.pins.models) | set(shortnames.table()))
