"""`provision model pull REF`: short names, every transport, the size shown first, split GGUFs.

``plan()`` resolves a reference (after short names) into a Plan; ``pull()`` shows its size,
asks above the threshold when the caller can ask, then fetches each file through the store
(each blob verified by its own sha256, resumable, under its own lock) and writes the ref last:
a split model gets a ref only once every part is whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provision.core import settings
from provision.core.errors import InvalidValue, RunCancelled
from provision.core.settings import Settings
from provision.models import remote, shortnames, transports
from provision.models.download import check_stall, stall_seconds
from provision.models.refs import _free_name, check_sha256
from provision.models.remote import Plan
from provision.models.store import PullResult, Store
from provision.models.transports import RegistryRef

# bytes: above this an interactive pull asks first (ramalama #2182); the setting ask_above
ASK_DEFAULT = settings.parse_size(settings.default_of("ask_above"))


def human(size: int | None) -> str:
    if size is None:
        return "unknown size"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size = size / 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def size_text(size: int | None) -> str:
    """A size as `ollama list` and `ramalama list` show one: decimal units, 2 GB, 491 MB, 934 kB."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            if unit == "B":
                return f"{size} B"
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def ask_threshold(given: settings.Settings | None = None) -> int:
    """The setting ask_above in bytes (checked where it was read)."""
    return (given or settings.current()).typed.ask_above


def plan(
    store: Store,
    arg: str,
    *,
    sha256: str | None = None,
    name: str | None = None,
    authfile: Path | None = None,
    stall_s: float | None = None,
    settings: Settings | None = None,
) -> Plan:
    """What pulling ``arg`` fetches (``settings``: the command's, for stall_s and the registries)."""
    target = shortnames.expand(arg)
    parsed = transports.parse(target)
    if parsed is None:
        spec = store.resolve(target, sha256=sha256, name=name)
        return Plan(spec.name, spec.source, (spec,))
    if sha256 is not None:
        check_sha256(sha256)
        raise InvalidValue(
            f"--sha256 with {target}: the registry's digest (or the hub's listing) is the pin of this reference",
            fix=f"drop --sha256 (or pull the file's URL with --sha256): provision model pull {target}",
        )
    if name is not None:
        _free_name(name, store.pins)  # before any request: a bad --name costs no network
    if authfile is not None and not isinstance(parsed, RegistryRef):
        raise InvalidValue(f"--authfile with {target}: only registries (ollama, oci, docker) take it",
                           fix="drop --authfile")  # fmt: skip
    stall = stall_seconds(settings) if stall_s is None else check_stall(stall_s, "--stall-timeout")
    if isinstance(parsed, RegistryRef):
        registry = parsed.registry or shortnames.registry(parsed.transport, settings)
        found = remote.registry_plan(parsed, name, registry, authfile, stall)
    else:
        found = remote.hf_plan(parsed, name, stall)
    _free_name(found.name, store.pins)  # a catalog name stays bound to its pin
    return found


def pull(
    store: Store, todo: Plan, *, stall_s: float | None = None, ask: Callable[[int], bool] | None = None,
    settings: Settings | None = None,
) -> PullResult:
    """Fetch ``todo``; ``ask(size)`` (None: cannot ask) decides a pull above the threshold
    (``settings``: the command's, for ask_above and stall_s)."""
    size = todo.size
    files = f"{len(todo.parts)} parts, " if len(todo.parts) > 1 else ""
    if size is not None:  # a URL's size is known only once its answer comes (then the progress shows it)
        store._say(f"{todo.name}: {files}{human(size)} from {todo.source}")
    threshold = ask_threshold(settings)
    if size is not None and size > threshold:
        if ask is None:
            store._say(f"{todo.name}: above ask_above ({human(threshold)}); not asking (non-interactive), pulling")
        elif not ask(size):
            raise RunCancelled(f"{todo.name}: pull of {human(size)} declined; nothing was fetched",
                               fix="run it again and answer y, or pass --yes")  # fmt: skip
    if len(todo.parts) == 1 and not todo.extras:  # a single file, or an image layer holding the model
        return store.pull(todo.parts[0], stall_s=stall_s)
    stall = stall_seconds(settings) if stall_s is None else check_stall(stall_s, "--stall-timeout")
    extras = {}
    for extra, body in todo.extras:
        _install_small(store, extra.sha256, body)
        extras[extra.role] = {"sha256": extra.sha256, "size": extra.size}
    done: list[dict[str, Any]] = []
    fetched = 0
    for part in todo.parts:
        sha256, got, new_bytes, _reused = store.fetch_blob(part, stall, write_ref=False)
        done.append({"sha256": sha256, "size": got, "file": part.file})
        fetched += new_bytes
    split = len(done) > 1
    ref = store._write_ref(
        todo.parts[0], done[0]["sha256"], done[0]["size"], parts=done if split else None, extras=extras or None
    )  # fmt: skip
    path = store.path(ref.name)
    return PullResult(ref, path, fetched, fetched == 0)


def _install_small(store: Store, sha256: str, body: bytes) -> None:
    """A small verified layer (template, params) as a blob; its bytes were hashed by the caller."""
    blob = store.blob_path(sha256)
    if blob.exists():
        return
    tmp = blob.with_name(f".{blob.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    store._install_blob(tmp, sha256)

