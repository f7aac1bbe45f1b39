"""`provision image render|build STACK`: guest images from the catalog."""

from __future__ import annotations

import argparse
from pathlib import Path

from provision.cli.output import command
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "image": "render or build guest images",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(
        sub,
        "image",
        COMMANDS["image"],
        "provision image llama-linux    (short for: image build llama-linux)",
        "provision image render llama --output out/llama",
    )
    isub = p.add_subparsers(dest="image_command", metavar="ACTION", required=True)

    r = command(
        isub,
        "render",
        "write a stack's Containerfile (deterministic)",
        "provision image render llama --output out/llama",
        json=True,
    )
    r.add_argument("stack")
    r.add_argument("--output", "-o", help="directory to write (default: print the Containerfile)")
    r.add_argument("--force", action="store_true", help="replace files in --output that provision did not write")
    r.add_argument("--catalog", type=Path, help=argparse.SUPPRESS)
    r.set_defaults(func=run_render)

    b = command(
        isub,
        "build",
        "build a stack's image with podman",
        "provision image build llama-linux",
        "provision image build llama --model tiny-llama",
        json=True,
    )
    b.add_argument("stack")
    b.add_argument("--tag", "-t", help="image reference (default: localhost/krun-gpu/STACK:<content hash>)")
    b.add_argument("--model", help="bake this catalog model into the image (verified on the host and in the build)")
    b.add_argument("--base-image", help=argparse.SUPPRESS)
    b.add_argument("--catalog", type=Path, help=argparse.SUPPRESS)
    b.set_defaults(func=run_build)


def run_render(args: argparse.Namespace) -> Result:
    from provision.core import catalog, outputs, pins
    from provision.images import build as images

    p = pins.default()
    stack = catalog.load(args.catalog).get(args.stack)
    rendered = images.render_stack(stack, p)
    out_dir = outputs.output_path(args.output, "--output")
    if out_dir is None:
        return Result(data={"containerfile": rendered.containerfile}, text=rendered.containerfile)
    written = [str(path) for path in rendered.write(out_dir, force=args.force)]
    return Result(data={"written": written}, text="\n".join(written))


def run_build(args: argparse.Namespace) -> Result:
    from provision.core import catalog, values
    from provision.images import build as images

    if args.tag is not None:
        values.image_ref(args.tag, "--tag")
    if args.base_image is not None:
        values.image_ref(args.base_image, "--base-image")
    if args.model is not None:  # what was pulled, as typed: the image names the model by its store name
        from provision.models import names
        from provision.models import store as models

        args.model = names.store_name(models.Store(), args.model)
    built = images.build(
        args.stack,
        tag=args.tag,
        model=args.model,
        catalog=catalog.load(args.catalog) if args.catalog else None,
        base_image=args.base_image,
    )
    r = built.totals
    data = {
        "ref": built.ref,
        "id": built.image_id,
        "stack": built.stack,
        "steps": r.steps,
        "layer_steps": r.layer_steps,
        "cached_steps": r.cached_steps,
        "size_bytes": built.result.size,
        "package_stages": [
            {"stage": s.stage, "ref": s.ref, "id": s.result.image_id, "size_bytes": s.result.size}
            for s in built.stages
        ],
    }
    lines = [f"built {built.ref} ({built.image_id[:12]}): {r.layer_steps} layer steps, {r.cached_steps} from cache"]
    # Every image this build made, with its size as `podman image ls` counts it (all layers).
    lines += [f"  {human_size(s.result.size):>10}  {s.ref}  ({s.stage} packages)" for s in built.stages]
    lines.append(f"  {human_size(built.result.size):>10}  {built.ref}  (the {built.stack} image)")
    return Result(data=data, text="\n".join(lines))


def human_size(size: int) -> str:
    """Bytes in binary units, one decimal: 912.4 MiB, 1.1 GiB."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
