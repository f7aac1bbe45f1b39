"""cmake + ninja: run a build plan, stream progress, fail with the step that broke."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from provision.adapters import runner
from provision.core.errors import BuildFailed, ToolMissing
from provision.core.log import say

_NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
Progress = Callable[[str], None]


class BuildPlan(Protocol):
    """What this adapter needs of a plan (the ggml builds' BuildPlan has it); no domain import."""

    @property
    def variant(self) -> str: ...

    @property
    def source(self) -> Path: ...

    @property
    def build_dir(self) -> Path: ...

    @property
    def configure(self) -> list[str]: ...

    @property
    def build(self) -> list[str]: ...

    @property
    def artifacts(self) -> tuple[str, ...]: ...


def require_tools(tools: tuple[str, ...], *, variant: str) -> None:
    missing = [t for t in tools if runner.found(t) is None]
    if missing:
        raise ToolMissing(
            f"the {variant} ggml build needs {', '.join(missing)} on PATH",
            fix="run scripts/setup-debian (cmake, ninja-build, g++, pkg-config, libdrm-dev)"
            + ("; install the CUDA toolkit and put nvcc on PATH" if "nvcc" in missing else "")
            + ("; apt-get install libvulkan-dev glslc" if "glslc" in missing else ""),
        )


def _run_step(name: str, cmd: list[str], *, plan: BuildPlan, log: Path, progress: Progress,
              env: dict[str, str] | None) -> float:
    started = time.monotonic()
    last_report = 0.0
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()

        def on_line(line: str) -> None:
            nonlocal last_report
            fh.write(line + "\n")
            match = _NINJA_PROGRESS.match(line.rstrip())
            now = time.monotonic()
            if match and (now - last_report > 5 or match.group(1) == match.group(2)):
                last_report = now
                progress(f"ggml {plan.variant}: [{match.group(1)}/{match.group(2)}] {match.group(3)[:100]}")

        # On the owned process tree: cmake, ninja and the compilers die with a killed provision.
        done = runner.run(cmd, name=f"cmake-{name}", on_line=on_line, env=env)
    seconds = time.monotonic() - started
    if done.status != 0:
        raise BuildFailed(
            f"ggml {plan.variant} build: step '{name}' failed (exit {done.status}) after {seconds:.0f} s; "
            f"log {log}\n" + "\n".join(line.rstrip() for line in done.tail),
            fix=f"read {log}; rerun with `provision ggml build --variant {plan.variant}` once fixed",
        )
    return seconds


def run(plan: BuildPlan, *, log: Path, progress: Progress | None = None,
        env: dict[str, str] | None = None) -> dict[str, float]:
    """Configure (only when the build dir has no build.ninja yet) and build the named targets."""
    timings: dict[str, float] = {}
    progress = progress or say("ggml")
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    # Configure again when the command changed (e.g. the offline include moved): a stale
    # build.ninja would re-run cmake with the old cache values.
    stamp = plan.build_dir / "krun-gpu-configure.json"
    configured = stamp.exists() and json.loads(stamp.read_text()) == plan.configure
    if not ((plan.build_dir / "build.ninja").exists() and configured):
        progress(f"ggml {plan.variant}: configure ({plan.source})")
        timings["configure_s"] = round(_run_step("configure", plan.configure, plan=plan, log=log,
                                                 progress=progress, env=env), 1)
        stamp.write_text(json.dumps(plan.configure))
    progress(f"ggml {plan.variant}: build {' '.join(plan.build[4:])}")
    timings["build_s"] = round(_run_step("build", plan.build, plan=plan, log=log, progress=progress, env=env), 1)
    missing = [a for a in plan.artifacts if not (plan.build_dir / "bin" / a).exists()]
    if missing:
        raise BuildFailed(f"ggml {plan.variant} build: step 'collect' found no {', '.join(missing)} in "
                          f"{plan.build_dir / 'bin'}", fix=f"read {log}")
    return timings
