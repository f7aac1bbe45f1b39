"""`provision serve STACK --model M --generate systemd|quadlet|kube --output FILE [--target HOST] [--force]`.

Thin: the same checks as serve (E007, loopback, port, name, options), then what serve runs on the
target host (this one by default): on Linux a systemd unit running `provision serve`
(provision.serve.generate_unit), on macOS the podman machine's container as a quadlet or a Pod
(provision.serve.generate); written whole to FILE (never over a file without --force).
Called from provision/cli/serve.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from provision.core.errors import InvalidValue
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.core.catalog import Stack
    from provision.serve.engine import ServerOptions

SUFFIX = {"systemd": ".service", "quadlet": ".container", "kube": ".yaml"}
RUNS = {"linux": "a QEMU guest, through `provision serve`", "darwin": "a container in the podman machine"}


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generate", choices=tuple(SUFFIX), default=None,
                   help="write what serve runs instead of serving: on Linux a systemd unit running provision serve, "
                        "on macOS a quadlet .container or a Pod YAML for the podman machine")  # fmt: skip
    p.add_argument("--target", choices=tuple(RUNS), default=None,
                   help="with --generate: the host the file is for (default: this one)")
    p.add_argument("--output", default=None, metavar="FILE", help="with --generate: the file to write (required)")
    p.add_argument("--force", action="store_true", help="with --generate: replace FILE if it exists")


def run(args: argparse.Namespace, stack: Stack, host: str, name: str, opts: ServerOptions) -> Result:
    from provision import hosts
    from provision.cli.run import resolve_model
    from provision.cli.serve_model import apply_defaults, model_defaults
    from provision.core import outputs, paths
    from provision.core.settings import BY_KEY
    from provision.serve import engine, generate, generate_unit

    target_host = args.target or hosts.platform_key()
    generate.check_target(args.generate, stack, target_host)
    target = outputs.output_path(args.output, "--output")
    if target is None:
        raise InvalidValue(f"--generate {args.generate} needs --output FILE",
                           fix=f"--output ./{name}{SUFFIX[args.generate]}")  # fmt: skip
    outputs.check_target(target, "--output", force=args.force)  # before a model is fetched
    model_path = resolve_model(args.model)
    assert model_path is not None  # --model is required
    if args.generate == "systemd":
        # The unit's serve reads the model (and its ollama template) from the same store itself.
        model = str(model_path) if Path(args.model).expanduser().is_file() else args.model
        # the settings this command runs with (environment, files, --set), so the unit's serve sees the same
        settings = args.app.settings
        env = {BY_KEY[k].env: v.value for k, v in settings.values.items()
               if v.value is not None and not v.source.startswith("default")}  # fmt: skip
        env["PROVISION_CACHE"] = str(paths.cache_root(settings))
        unit = generate_unit.Unit(
            stack=stack, model=model, gpu=args.gpu, python=sys.executable,
            package_root=str(Path(generate.__file__).resolve().parents[2]), host=host, port=args.port,
            ctx=args.ctx, parallel=args.parallel, name=name, wait_s=args.wait, route=args.route, options=opts, env=env,
        )  # fmt: skip
        text, image = generate_unit.render(unit), None
    else:
        found = model_defaults(args.model, model_path)
        served = generate.Served(stack=stack, image=generate.default_image(stack), model_path=model_path,
                                 model=engine.model_alias(args.model, model_path), gpu=args.gpu, host=host,
                                 port=args.port, ctx=args.ctx if args.ctx is not None else found.ctx,
                                 parallel=args.parallel, name=name, options=apply_defaults(opts, found))  # fmt: skip
        text, image = generate.render(args.generate, served), served.image
    outputs.write_text(target, text, flag="--output", force=args.force)
    args.app.say("serve")(f"provision: wrote {args.generate} to {target}: on {target_host} serve runs {stack.name} "
                          f"as {RUNS[target_host]}{f' ({image})' if image else ''}")  # fmt: skip
    return Result({"kind": args.generate, "target": target_host, "path": str(target), "image": image,
                   "model": args.model}, str(target))  # fmt: skip
