"""Where a model's file is or will be, for a plan that writes and fetches nothing (`provision run --dry-run`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from provision.core import pins as pins_mod
from provision.core.errors import UnknownModel
from provision.core.settings import Settings, current
from provision.models.records import DamagedRefError, load_ref
from provision.models.refs import check_name


def planned(name: str, settings: Settings | None = None) -> Path:
    """The stored blob of ``name``, else where the catalog's file will be once pulled or synthesized.
    Reads the store's refs only: no directory made, no lock taken, no request sent."""
    root, pins = (settings or current()).typed.cache / "models", pins_mod.default()
    ref_path = root / "refs" / f"{check_name(name)}.json"
    with contextlib.suppress(DamagedRefError):  # a damaged ref: the run says so; the plan shows the catalog's file
        if ref_path.is_file():
            return root / "blobs" / f"sha256-{load_ref(ref_path).sha256}"
    if (pin := pins.models.get(name)) is None:
        from provision.core.suggest import did_you_mean
        from provision.models import shortnames

        stored = [p.stem for p in (root / "refs").glob("*.json")]
        hint = did_you_mean(name, [*stored, *pins.models, *shortnames.table()])
        raise UnknownModel(f"model {name!r} is neither in the catalog nor in the store",
                           fix=f"{hint} (provision model list)" if hint else "provision model list")  # fmt: skip
    return root / "blobs" / f"sha256-{pin.sha256}"
