"""Where a model's file is or will be, for a plan that writes and fetches nothing (`provision run --dry-run`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from provision.core import pins as pins_mod
from provision.core.settings import Settings, current
from provision.models import names
from provision.models.records import DamagedRefError, load_ref
from provision.models.store import Store


def planned(typed: str, settings: Settings | None = None) -> Path:
    """The stored blob of what ``typed`` names (any way a pull accepted: NAME:TAG, a short name, a
    reference), else where the catalog's file will be once pulled or synthesized. Reads the store's refs
    only: no directory made, no lock taken, no request sent. E010 as a run would say it otherwise."""
    store = Store.reading((settings or current()).typed.cache / "models", pins_mod.default())
    found = names.lookup(store, typed)
    if found.name is not None:
        ref_path = store.root / "refs" / f"{found.name}.json"
        # a damaged ref: the run says so; the plan shows the catalog's file, or the run's error now
        with contextlib.suppress(DamagedRefError, OSError):
            return store.blob_path(load_ref(ref_path).sha256)
    pin = store.pins.models.get(found.name or found.catalog or "")
    if pin is None:
        raise found.missing(store.root, names.known_names(store))
    return store.blob_path(pin.sha256)
