"""`provision config show`: every setting, the value in force and where it came from.

Layers, lowest first: built-in defaults, the system file (/etc/krun-gpu/config.toml, or
$PROVISION_SYSTEM_CONFIG), the user's file (<XDG config dir>/krun-gpu/config.toml, or
$PROVISION_CONFIG), the environment (PROVISION_*), flags (``provision --set KEY=VALUE``).
"""

from __future__ import annotations

import argparse

from provision.cli.output import command, table
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "config": "the settings in force and where each came from (defaults, files, PROVISION_*, --set)",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "config", COMMANDS["config"], "provision config show", "provision --set accel=tcg config show")
    actions = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    s = command(
        actions,
        "show",
        "each setting with its value and source; the config files read; the cache layout",
        "provision config show --json",
        json=True,
    )
    s.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> Result:
    from provision.core import paths

    settings = args.app.settings
    rows = settings.rows()
    files = [{"layer": layer, "path": str(path), "present": there} for layer, path, there in settings.files]
    layout = {f"cache/{k}": v for k, v in paths.LAYOUT.items()}
    layout |= {f"state/{k}": v for k, v in paths.STATE_LAYOUT.items()}

    def text() -> str:
        parts = [
            table(["SETTING", "VALUE", "SOURCE", "ENV", "TYPE"],
                  [(r["key"], r["value"], r["source"], r["env"], r["type"]) for r in rows]),  # fmt: skip
            table(["FILE", "PATH", "READ"], [(f["layer"], f["path"], "yes" if f["present"] else "-") for f in files]),
            table(["DIRECTORY", "WHAT LIVES THERE"], sorted(layout.items())),
        ]
        return "\n\n".join(parts)

    return Result({"settings": rows, "files": files, "layout": layout}, text)
