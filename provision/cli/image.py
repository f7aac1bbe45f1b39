"""`provision image render|build STACK`: guest images from the catalog."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from provision.cli.output import EXAMPLE_FORMAT, dumps, example


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "image",
        help="render or build guest images",
        epilog=example(
            "provision image llama-linux    (short for: image build llama-linux)",
            "provision image render llama --output out/llama",
        ),
        formatter_class=EXAMPLE_FORMAT,
    )
    isub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    r = isub.add_parser(
        "render",
        help="write a stack's Containerfile (deterministic)",
        epilog=example("provision image render llama --output out/llama"),
        formatter_class=EXAMPLE_FORMAT,
    )
    r.add_argument("stack")
    r.add_argument("--output", "-o", type=Path, help="directory to write (default: print the Containerfile)")
    r.add_argument("--catalog", type=Path, help=argparse.SUPPRESS)
    r.set_defaults(func=run_render)

    b = isub.add_parser(
        "build",
        help="build a stack's image with podman",
        epilog=example("provision image build llama-linux", "provision image build llama --model tiny-llama"),
        formatter_class=EXAMPLE_FORMAT,
    )
    b.add_argument("stack")
    b.add_argument("--tag", "-t", help="image reference (default: localhost/krun-gpu/STACK:<content hash>)")
    b.add_argument("--model", help="bake this catalog model into the image (verified on the host and in the build)")
    b.add_argument("--base-image", help=argparse.SUPPRESS)
    b.add_argument("--catalog", type=Path, help=argparse.SUPPRESS)
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    b.set_defaults(func=run_build)


def run_render(args: argparse.Namespace) -> int:
    from provision.core import catalog, pins
    from provision.images import build as images

    p = pins.default()
    stack = catalog.load(args.catalog).get(args.stack)
    rendered = images.render_stack(stack, p)
    if args.output is None:
        sys.stdout.write(rendered.containerfile)
        return 0
    for path in rendered.write(args.output):
        print(path)
    return 0


def run_build(args: argparse.Namespace) -> int:
    from provision.core import catalog
    from provision.images import build as images

    built = images.build(
        args.stack,
        tag=args.tag,
        model=args.model,
        catalog=catalog.load(args.catalog) if args.catalog else None,
        base_image=args.base_image,
    )
    r = built.result
    if args.json:
        print(
            dumps(
                {
                    "ref": built.ref,
                    "id": built.image_id,
                    "stack": built.stack,
                    "steps": r.steps,
                    "layer_steps": r.layer_steps,
                    "cached_steps": r.cached_steps,
                }
            )
        )
    else:
        print(f"built {built.ref} ({built.image_id[:12]}): {r.layer_steps} layer steps, {r.cached_steps} from cache")
    return 0
