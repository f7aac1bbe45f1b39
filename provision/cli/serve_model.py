"""The model `provision serve` serves, beyond its file: an ollama model's template and params.

Shared by serve and `serve --generate` (provision.serve.model_defaults converts them; the store says
which model a served file is).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provision.serve.engine import ServerOptions
    from provision.serve.model_defaults import ModelDefaults


def model_defaults(ref: str, path: Path) -> ModelDefaults:
    """An ollama model's template and params (serve/model_defaults.py); nothing for a GGUF path."""
    from provision.models.store import Store
    from provision.serve import model_defaults as defaults

    if Path(ref).expanduser().is_file():
        return defaults.ModelDefaults()
    # read only: a dry run asks this too, and it must make nothing (not even the cache's folder)
    return defaults.for_model(Store.reading(), ref, path)


def apply_defaults(options: ServerOptions, found: ModelDefaults) -> ServerOptions:
    from provision.core.log import say

    for note in found.notes:
        say("serve")(f"provision: model: {note}")
    return replace(options, chat_template=found.chat_template, model_args=found.args, model_stop=found.stop)
