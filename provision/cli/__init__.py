"""The thin command line: parse, call one domain function, print, map errors to exit codes.

Each command group lives in its own module with ``register(subparsers)``; the handler it
sets returns an exit status. Errors are ProvisionError subclasses (provision/core/errors.py).
May import every package; nothing imports it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from provision.core.errors import ProvisionError

# Order is the order shown in --help. Command modules import nothing heavy at the top:
# their handlers import the domain they call, so `provision --help` starts fast.
COMMAND_MODULES = ["stacks", "image", "model", "host_tools", "launch", "run", "bench", "doctor", "ggml", "apir", "api"]

DESCRIPTION = """\
GPU llama.cpp in Linux guests, from the host's GPU.

provision builds guest images, fetches sha256-verified models, and starts guests that
reach the host GPU: on macOS a podman machine with krunkit (Venus -> MoltenVK -> Metal,
or APIR -> ggml-metal); on Linux QEMU + virglrenderer (Venus -> the host's Vulkan driver,
or APIR -> a host ggml backend). No silent CPU fallback: asking for a GPU on a stack
without one is refused (E007) before anything starts."""

QUICK_START = """\
quick start (Linux):
  sudo provision host-tools                      # QEMU + virglrenderer in a cached chroot
  sudo provision image llama-linux               # build the guest image
  provision model synth tiny-llama               # a small real GGUF, made offline
  sudo provision run llama-linux --gpu --model tiny-llama -- vulkaninfo --summary
quick start (macOS):
  nix profile add .#krun && provision image llama && provision launch
  provision run llama --gpu --model tiny-llama -- llama-bench -m "$MODEL" -dev Vulkan0

`provision COMMAND --help` shows each command's options and an example."""

# `provision image STACK` is the design card's short form of `provision image build STACK`.
IMAGE_ACTIONS = ("render", "build")


def expand_short_forms(argv: list[str]) -> list[str]:
    if len(argv) >= 2 and argv[0] == "image" and argv[1] not in IMAGE_ACTIONS and not argv[1].startswith("-"):
        return ["image", "build", *argv[1:]]
    return argv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provision",
        description=DESCRIPTION,
        epilog=QUICK_START,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {importlib.import_module('provision').__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(expand_short_forms(list(sys.argv[1:] if argv is None else argv)))
    try:
        status = args.func(args)
    except ProvisionError as exc:
        if getattr(args, "json", False):
            print(json.dumps({"error": exc.as_dict()}, indent=2))
        print(exc.render(), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(status or 0)
