"""`provision pull|list|rm|inspect|info|version`: the words RamaLama and ollama users type first.

`pull`, `list`, `rm` and `inspect` are `provision model …` under the names those tools use (the
same parser, built by provision/cli/model.py, so the two spellings cannot drift apart); `info`
says what this host has (version, platform, where the caches are, stacks, stored models, serves),
`version` the version. Nothing here starts a guest or sends a request.
"""

from __future__ import annotations

import argparse

from provision.cli import model
from provision.cli.output import command
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "pull": "= provision model pull: fetch a model, verify its sha256, store it",
    "list": "= provision model list: catalog models and what the store holds",
    "rm": "= provision model rm: remove a stored model",
    "inspect": "= provision model inspect: a stored model's GGUF metadata",
    "info": "this host at a glance: version, platform, cache, stacks, stored models, running serves",
    "version": "print provision's version",
}


def register(sub: argparse._SubParsersAction) -> None:
    for name, add in (("pull", model.add_pull), ("list", model.add_list), ("rm", model.add_rm),
                      ("inspect", model.add_inspect)):  # fmt: skip
        p = add(sub, name)
        p.description = COMMANDS[name]
    p = command(sub, "info", COMMANDS["info"], "provision info", "provision info --json", json=True)
    p.set_defaults(func=info)
    p = command(sub, "version", COMMANDS["version"], "provision version", "provision version --json", json=True)
    p.set_defaults(func=version)


def _version() -> str:
    import provision

    return str(provision.__version__)


def version(args: argparse.Namespace) -> Result:
    return Result({"version": _version()}, f"provision {_version()}")


def info(args: argparse.Namespace) -> Result:
    import platform

    from provision.core import catalog, paths
    from provision.models import store as models
    from provision.serve import state as serve_state

    settings = args.app.settings
    system = platform.system().lower()
    stacks = catalog.load().stacks
    store = models.Store()
    refs = store.refs()
    stored = sorted(r.name for r in refs)
    usable = sorted(name for name, s in stacks.items() if system in s.hosts)
    serves = serve_state.entries()
    data = {
        "version": _version(),
        "host": {"system": system, "machine": platform.machine(), "python": platform.python_version()},
        "cache": str(paths.cache_root(settings)),
        "store": {"root": str(store.root), "models": stored},
        "stacks": usable,
        "serves": [{"name": e.name, "url": e.url, "model": e.model} for e in serves],
    }
    lines = [
        f"provision {data['version']} on {system} {platform.machine()} (Python {platform.python_version()})",
        f"cache:   {data['cache']}",
        f"models:  {len(refs)} in {store.root}" + (f" ({', '.join(stored)})" if refs else ""),
        f"stacks:  {', '.join(usable) or 'none for this host'}",
        "serves:  " + (", ".join(f"{e.name} {e.url}" for e in serves) or "none running"),
        "`provision doctor` checks this host's GPU route.",
    ]
    return Result(data, "\n".join(lines))
