"""`provision serve STACK --model M --generate quadlet|kube --output FILE [--force]`.

Thin: the same checks as serve (E007, loopback, port, name), then provision.serve.generate
renders the unit or the Pod YAML, written whole to FILE (never over a file without --force).
Called from provision/cli/serve.py.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from provision.core.errors import InvalidValue
from provision.core.result import Result

if TYPE_CHECKING:
    from provision.core.catalog import Stack

SUFFIX = {"quadlet": ".container", "kube": ".yaml"}


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generate", choices=tuple(SUFFIX), default=None,
                   help="write a podman quadlet .container unit or a Kubernetes Pod YAML instead of serving")
    p.add_argument("--output", default=None, metavar="FILE", help="with --generate: the file to write (required)")
    p.add_argument("--force", action="store_true", help="with --generate: replace FILE if it exists")


def run(args: argparse.Namespace, stack: Stack, host: str, name: str) -> Result:
    from provision.cli.run import resolve_model
    from provision.core import outputs
    from provision.serve import engine, generate

    target = outputs.output_path(args.output, "--output")
    if target is None:
        raise InvalidValue(f"--generate {args.generate} needs --output FILE",
                           fix=f"--output ./{name}{SUFFIX[args.generate]}")  # fmt: skip
    outputs.check_target(target, "--output", force=args.force)  # before a model is fetched
    model_path = resolve_model(args.model)
    assert model_path is not None  # --model is required
    served = generate.Served(stack=stack, image=generate.default_image(stack), model_path=model_path,
                             model=engine.model_alias(args.model, model_path), gpu=args.gpu, host=host,
                             port=args.port, ctx=args.ctx, parallel=args.parallel, name=name)  # fmt: skip
    text = generate.render(args.generate, served)
    outputs.write_text(target, text, flag="--output", force=args.force)
    args.app.say("serve")(f"provision: wrote {args.generate} for {served.model} ({served.image}) to {target}")
    return Result({"kind": args.generate, "path": str(target), "image": served.image, "model": served.model},
                  str(target))
