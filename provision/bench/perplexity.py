"""llama-perplexity: the guest command, whether a stack has the tool, and the number it prints.

Pure. The device rules are `provision run`'s: with the GPU all layers go to the stack's device
(E007 before anything starts on a stack without one), without it none do (``-dev none``), so a
GPU perplexity can never quietly be a CPU one.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from provision.core.catalog import Stack
from provision.core.errors import InvalidValue, ToolMissing, VmFailed

TOOL = "llama-perplexity"
DEFAULT_CTX = 256
DEFAULT_CHUNKS = 8
TEXT_NAME = "perplexity.txt"  # the text's name beside the model on the read-only model disk
# perplexity.cpp: LOG("Final estimate: PPL = %.4lf +/- %.5lf\n", ...)
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+|nan|inf) \+/- ([0-9.]+|nan|inf)")
_TOO_SHORT = re.compile(r"you need at least (\d+) tokens")


def check_tool(stack: Stack, tool_packages: Mapping[str, str], catalog_path: str = "provision/data/stacks.yaml",
               ) -> None:  # fmt: skip
    """E006 unless the stack's image has ``llama-perplexity``: a build target, or the Debian package
    that ships it (pins.json debian.tool_packages) among the stack's packages."""
    if stack.build is not None:
        if TOOL in stack.build.targets:
            return
        raise ToolMissing(
            f"stack {stack.name!r} builds llama.cpp without {TOOL} (build.targets: {', '.join(stack.build.targets)})",
            fix=f"add {TOOL} to stacks.{stack.name}.build.targets in {catalog_path} and rebuild the image",
        )
    package = tool_packages.get(TOOL)
    if package and package in stack.packages:
        return
    raise ToolMissing(
        f"stack {stack.name!r} has no {TOOL}: its packages ({', '.join(stack.packages) or 'none'}) "
        f"do not include {package or 'the package that ships it'}",
        fix=f"add {package} to stacks.{stack.name}.packages in {catalog_path} (pinned in pins.json "
        "debian.guest_packages), or use llama-linux",
    )


def check_numbers(ctx: int, chunks: int) -> None:
    if not 16 <= ctx <= 1 << 20:
        raise InvalidValue(f"--ctx {ctx}: expected 16 to {1 << 20} tokens", fix=f"--ctx {DEFAULT_CTX}")
    if not 1 <= chunks <= 100_000:
        raise InvalidValue(f"--chunks {chunks}: expected 1 to 100000", fix=f"--chunks {DEFAULT_CHUNKS}")


def where(stack: Stack, gpu: bool) -> str:
    if not gpu:
        return "guest-cpu"
    return "guest-apir" if stack.route == "apir" else "guest-gpu"


def guest_command(stack: Stack, gpu: bool, text_path: str, ctx: int, chunks: int) -> list[str]:
    """``llama-perplexity`` on the model ($MODEL, set by the job script) and the mounted text."""
    args = [TOOL, "-m", "MODEL_PATH", "-f", text_path, "-c", str(ctx), "-b", str(ctx), "--chunks", str(chunks)]
    if gpu:
        args += ["-ngl", "99"] + (["-dev", stack.device] if stack.device else [])
    else:
        args += ["-ngl", "0", "-dev", "none"]
    run = "exec " + shlex.join(args).replace("MODEL_PATH", '"$MODEL"') + " 2>&1"
    # The device list first (no model loaded): the record names what the device is, as bench's does.
    listing = f"{shlex.join([TOOL, '--list-devices'])} 2>&1; " if gpu else ""
    return ["sh", "-c", listing + run]


def too_short(text: str) -> InvalidValue | None:
    """The user's error when llama-perplexity refused a text shorter than two contexts."""
    short = _TOO_SHORT.search(text)
    if short is None:
        return None
    return InvalidValue(f"the text is too short for --ctx: {TOOL} needs at least {short.group(1)} tokens",
                        fix="give a longer --text, or a smaller --ctx")  # fmt: skip


def used_device(text: str, device: str | None) -> str | None:
    """``device`` as `--list-devices` describes it ("Vulkan0: Virtio-GPU Venus (…)"), or None."""
    if not device:
        return None
    m = re.search(rf"^\s*{re.escape(device)}: (.+?)(?: \(\d+ MiB[^)]*\))?\s*$", text, re.M)
    return f"{device}: {m.group(1)}" if m else None


@dataclass(frozen=True)
class Estimate:
    ppl: float
    error: float  # llama-perplexity's +/- (standard error of the estimate)


def parse(text: str) -> Estimate:
    """The final estimate llama-perplexity prints; VmFailed (with its words) when there is none."""
    m = _FINAL.search(text)
    if m is None:
        short = too_short(text)
        if short is not None:
            raise short
        raise VmFailed(f"{TOOL} printed no final estimate: {text.strip()[-800:]!r}")
    ppl, err = float(m.group(1)), float(m.group(2))
    if not math.isfinite(ppl) or ppl < 1.0:
        raise VmFailed(f"{TOOL} reports PPL = {m.group(1)}, not a perplexity (>= 1): the model's output is broken")
    return Estimate(ppl, err)
