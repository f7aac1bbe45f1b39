"""`provision run MODEL` and `provision serve MODEL`: a model where a stack would stand, as RamaLama
and ollama users type it. The word is a model when it is a GGUF file or anything the store's one look-up
takes (a stored, catalog or short name, NAME:TAG, a reference); nothing is fetched or written to tell."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from provision.core.errors import BadModelName, InvalidValue, UnknownStack

if TYPE_CHECKING:
    from provision.models.names import Store


def model_word(args: argparse.Namespace, usage: str) -> str:
    """The model ``args.stack`` names (``args.stack`` then cleared, so the stack is picked as for --model).
    No word, or a stack, is a usage error (E003); a word that is neither names the stacks and models
    near it (E001)."""
    from provision.core import catalog
    from provision.core.suggest import did_you_mean
    from provision.models import names

    word, command = args.stack, args.command
    stacks = catalog.load()
    if word is None or word in stacks.stacks:
        what = f"stack {word!r} and " if word else ""
        missing = "no command to run in the guest" if command == "run" else "no model to serve"
        raise InvalidValue(f"provision {command}: {what}{missing}", fix=usage)
    if args.model is not None:
        raise InvalidValue(f"provision {command} {word}: a model named twice (--model {args.model})", fix=usage)
    store = _store(args)
    if not is_model(word, store):
        hint = did_you_mean(word, [*stacks.stacks, *names.known_names(store)])
        raise UnknownStack(f"provision {command} {word}: neither a stack nor a model",
                           fix=f"{hint} (`provision stacks`, `provision list`)" if hint else usage)  # fmt: skip
    args.stack = None
    return str(word)


def is_model(word: str, store: Store) -> bool:
    """Whether ``word`` names a model (a GGUF file, a stored, catalog or short name, a reference: one not
    pulled yet is still a model, and resolving it says how to pull it)."""
    if Path(word).expanduser().is_file():
        return True
    from provision.models import names

    if names.is_reference(word):
        return True
    try:
        found = names.lookup(store, word)
    except BadModelName:
        return False
    return found.name is not None or found.catalog is not None or found.means != word


def _store(args: argparse.Namespace) -> Store:
    from provision.models.store import Store

    return Store.reading(args.app.settings)
