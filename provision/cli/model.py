"""`provision model …`: pull, list, verify, remove, locate and synthesize GGUF models."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from provision.cli import output
from provision.cli.output import command, table
from provision.core.errors import ModelHashMismatch
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.core.settings import Settings

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "model": "the model store: pull, list, inspect, verify, rm, path, synth",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "model", COMMANDS["model"], "provision model synth tiny-llama", "provision model list")
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)

    add_pull(msub, "pull")
    add_inspect(msub, "inspect")
    add_list(msub, "list")

    ver = command(msub, "verify", "re-hash stored models against their sha256", "provision model verify tiny-llama",
                  json=True)
    ver.add_argument("name", nargs="?", help="one model (default: every stored model)")
    ver.set_defaults(func=run_verify)

    add_rm(msub, "rm")

    path = command(msub, "path", "print the stored file of a model", "provision model path tiny-llama", json=True)
    path.add_argument("name")
    path.set_defaults(func=run_path)

    syn = command(
        msub,
        "synth",
        "write a synthetic model (tiny-llama) and check it against its pin",
        "provision model synth tiny-llama",
        json=True,
    )
    syn.add_argument("name", metavar="NAME", help="a synthetic catalog model (`provision model list` shows which)")
    syn.add_argument("--output", help="write this file instead of into the store (whole or not at all)")
    syn.add_argument("--force", action="store_true", help="replace an existing --output file")
    syn.set_defaults(func=run_synth)


def _spoken(sub: argparse._SubParsersAction, name: str) -> str:
    """How the user types the action where it is built: `provision model pull` or `provision pull`."""
    return f"{sub._prog_prefix} {name}"


# The model store's everyday actions, built under `model` and (provision/cli/aliases.py) at the top
# level, where RamaLama and ollama users type them: one parser definition for both spellings.
def add_pull(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    said = _spoken(sub, name)
    pull = command(
        sub,
        name,
        "download a model, verify its sha256 and store it",
        f"{said} hf://OWNER/REPO/model.gguf --sha256 HEX",
        json=True,
    )
    pull.add_argument(
        "ref",
        metavar="REF",
        help="a catalog or short name, a URL, hf://OWNER/REPO/FILE[@REV], hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], "
        "ollama://NAME[:TAG], NAME:TAG, oci://REGISTRY/REPO:TAG or docker://[REGISTRY/]REPO:TAG",
    )
    pull.add_argument("--sha256", metavar="HEX", help="expected sha256 (catalog models carry their own)")
    pull.add_argument("--name", help="store it under this name (default: catalog name or file name)")
    pull.add_argument(
        "--stall-timeout",
        type=float,
        metavar="S",
        help="retry when no byte arrived for S seconds (default 20, or $PROVISION_STALL_S)",
    )
    pull.add_argument("--yes", "-y", action="store_true", help="do not ask before a big pull ($PROVISION_ASK_ABOVE)")
    pull.add_argument("--authfile", metavar="FILE", help="registry credentials, podman's auth.json format")
    pull.set_defaults(func=run_pull)
    return pull


def add_inspect(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    said = _spoken(sub, name)
    ins = command(sub, name, "GGUF metadata of a stored model", f"{said} tiny-llama --json",
                  json=True)
    ins.add_argument("name")
    ins.set_defaults(func=run_inspect)
    return ins


def add_list(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    said = _spoken(sub, name)
    lst = command(sub, name, "catalog models and what the store holds", f"{said} --json", json=True)
    lst.add_argument("--shortnames", action="store_true", help="the short names (ours and your file's) instead")
    lst.set_defaults(func=run_list)
    return lst


def add_rm(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    said = _spoken(sub, name)
    rm = command(sub, name, "remove a name (and its blob when no other name uses it)", f"{said} tiny-llama",
                 json=True)
    rm.add_argument("name")
    rm.set_defaults(func=run_rm)
    return rm


def _ask(size: int) -> bool:
    from provision.models.fetch import human

    try:
        answer = output.ask(f"pull {human(size)}? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def run_pull(args: argparse.Namespace) -> Result:
    from pathlib import Path

    from provision.models import fetch
    from provision.models import store as models
    from provision.models.download import check_stall

    stall = check_stall(args.stall_timeout, "--stall-timeout") if args.stall_timeout is not None else None
    store = models.Store()
    authfile = Path(args.authfile) if args.authfile is not None else None
    todo = fetch.plan(store, args.ref, sha256=args.sha256, name=args.name, authfile=authfile, stall_s=stall,
                      settings=args.app.settings)
    interactive = not args.yes and sys.stdin.isatty() and sys.stderr.isatty()
    result = fetch.pull(store, todo, stall_s=stall, ask=_ask if interactive else None, settings=args.app.settings)
    report = {
        **result.ref.as_dict(),
        "path": str(result.path),
        "fetched_bytes": result.fetched_bytes,
        "reused": result.reused,
    }
    how = "already in the store" if result.reused else f"fetched {result.fetched_bytes} bytes"
    ref = result.ref
    return Result(report, f"{ref.name}: sha256 {ref.sha256} ({ref.size} bytes), {how}\n{result.path}")


def _pin_note(status: str | None, synth: str | None) -> str:
    if synth:
        return "written locally by `provision model synth`; hash COMPUTED here"
    if status == "READ":
        return "hash READ from public listings; bytes never downloaded by this project"
    if status is None:
        return "not pinned: hash recorded at first pull"
    if status == "DIGEST":
        return "hash is the registry's digest (checked on pull)"
    if status == "LAYER":
        return "hash computed from the image layer the registry's digest checked"
    if status == "LISTED":
        return "hash from the hub's file listing (checked on pull)"
    return f"hash {status}"


def run_inspect(args: argparse.Namespace) -> Result:
    from provision.models import inspect, names
    from provision.models import store as models

    store = models.Store()
    info = inspect.inspect(store, names.stored(store, args.name))
    keys = ("name", "architecture", "parameters", "quantization", "context_length", "tensor_count", "size",
            "parts", "sha256", "source", "path")  # fmt: skip
    lines = [f"{key:15} {info[key]}" for key in keys]
    lines += [f"{role:15} {value if isinstance(value, str) else json.dumps(value, sort_keys=True)}"
              for role, value in info.get("extras", {}).items()]  # fmt: skip
    return Result(info, "\n".join(lines))


def _list_shortnames(settings: Settings) -> Result:
    from provision.models import shortnames

    rows = [{"name": s.name, "reference": s.reference, "from": str(s.origin)} for s in shortnames.table().values()]
    text = table(["NAME", "REFERENCE", "FROM"], [(r["name"], r["reference"], r["from"]) for r in rows])
    mine = shortnames.user_file(settings)
    text += f"\n\nyour file (overrides these): {mine}"
    return Result({"user_file": str(mine), "shortnames": rows}, text)


def run_list(args: argparse.Namespace) -> Result:
    from provision.models import store as models
    from provision.models.fetch import size_text

    if args.shortnames:
        return _list_shortnames(args.app.settings)

    store = models.Store()
    rows: list[dict[str, object]] = []
    good, damaged = store.scan()
    stored = {r.name: r for r in good}
    for name in models.catalog_names(store.pins):
        pin = store.pins.models[name]
        ref = stored.pop(name, None)
        rows.append({
            "name": name,
            "catalog": True,
            "default": name == models.DEFAULT_MODEL,
            "smoke_default": name == models.SMOKE_MODEL,
            "stored": ref is not None and store.blob_path(ref.sha256).exists(),
            "sha256": pin.sha256,
            "size": pin.size,
            "source": pin.hf or f"synth:{pin.synth}",
            "pin_status": pin.status,
            "note": _pin_note(pin.status, pin.synth),
        })  # fmt: skip
    for ref in stored.values():
        rows.append({
            "name": ref.name,
            "catalog": False,
            "default": False,
            "smoke_default": False,
            "stored": all(store.blob_path(sha).exists() for sha, _ in ref.blobs()),
            "sha256": ref.sha256,
            "size": sum(size for _, size in ref.blobs()),
            "source": ref.source,
            "pin_status": ref.pin_status,
            "note": _pin_note(ref.pin_status if ref.pinned else None, None),
        })  # fmt: skip
    for bad in damaged:
        rows.append({
            "name": bad.name,
            "catalog": bad.name in store.pins.models,
            "default": False,
            "smoke_default": False,
            "stored": False,
            "sha256": None,
            "size": None,
            "source": None,
            "pin_status": None,
            "damaged": bad.reason,
            "note": f"DAMAGED ref ({bad.reason}): provision model rm {bad.name}",
        })  # fmt: skip
    marks = {True: "yes", False: "-"}

    def size(row: dict[str, object]) -> str:
        return size_text(row["size"] if isinstance(row["size"], int) else None)

    text = table(
        ["NAME", "STORED", "SIZE", "SHA256", "PIN", "NOTE"],
        [(str(r["name"]) + (" (default)" if r["default"] else "") + (" (smoke)" if r["smoke_default"] else ""),
          marks[bool(r["stored"])], size(r), str(r["sha256"])[:12], r["pin_status"] or "-", r["note"]) for r in rows],
    )  # fmt: skip
    return Result({"store": str(store.root), "models": rows}, f"{text}\n\nstore: {store.root}")


def run_verify(args: argparse.Namespace) -> Result:
    from provision.models import names
    from provision.models import store as models

    store = models.Store()
    if args.name:
        which = [names.stored(store, args.name)]
    else:
        good, damaged = store.scan()
        which = sorted([r.name for r in good] + [d.name for d in damaged])
    results = [store.verify(n) for n in which]
    lines = [f"{'OK ' if r.ok else 'BAD'}  {r.name}: {r.detail}" for r in results] or ["the store holds no models"]
    bad = [r for r in results if not r.ok]
    error = ModelHashMismatch(
        "; ".join(f"{r.name}: {r.detail}" for r in bad),
        fix=f"provision model rm {bad[0].name}, then pull (or synth) it again",
    ) if bad else None  # fmt: skip
    return Result([r.as_dict() for r in results], "\n".join(lines), error=error)


def run_rm(args: argparse.Namespace) -> Result:
    from provision.models import names
    from provision.models import store as models

    store = models.Store()
    ref = store.remove(names.stored(store, args.name))
    if isinstance(ref, models.DamagedRef):
        text = f"removed the damaged ref {ref.name} ({ref.reason})"
    else:
        text = f"removed {ref.name} (sha256 {ref.sha256})"
    return Result({"removed": ref.as_dict()}, text)


def run_path(args: argparse.Namespace) -> Result:
    from provision.models import names
    from provision.models import store as models

    store = models.Store()
    name = names.stored(store, args.name)
    path = store.path(name)
    return Result({"name": name, "path": str(path)}, str(path))


def run_synth(args: argparse.Namespace) -> Result:
    from provision.core import outputs
    from provision.models import store as models

    output = outputs.output_path(args.output, "--output")
    store = models.Store()
    if output is not None:
        sha256, size = store.synth_to(args.name, output, force=args.force)
        report = {"name": args.name, "sha256": sha256, "size": size, "path": str(output)}
    else:
        result = store.synth(args.name)
        report = {"name": args.name, "sha256": result.ref.sha256, "size": result.ref.size, "path": str(result.path)}
    sha256, size = report["sha256"], report["size"]
    return Result(report, f"{args.name}: sha256 {sha256} ({size} bytes) matches the pin\n{report['path']}")
