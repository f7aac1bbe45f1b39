"""Where a model's file is or will be, for a plan that writes and fetches nothing (`provision run --dry-run`)."""

from __future__ import annotations

from pathlib import Path

from provision.core.settings import Settings, current
from provision.models import names, splits
from provision.models.store import Store


def planned(typed: str, settings: Settings | None = None) -> Path:
    """The stored file of what ``typed`` names (any way a pull accepted: NAME:TAG, a short name, a
    reference; a split model's part 1, where the run links its parts), else where the catalog's file will
    be once pulled or synthesized. Reads the store's refs only: no directory made, no lock taken, no
    request sent. A damaged ref or an unknown model is the run's own error (E010, E013)."""
    store = Store.reading(settings or current())
    found = names.lookup(store, typed)
    ref = store.ref(found.name) if found.name is not None else None
    if ref is not None:
        return splits.part_one(store.root, ref) if ref.parts else store.blob_path(ref.sha256)
    pin = store.pins.models.get(found.name or found.catalog or "")
    if pin is None:
        raise found.missing(store.root, names.known_names(store))
    return store.blob_path(pin.sha256)
