"""cmake + ninja: run a build plan, stream progress, fail with the step that broke."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from provision.adapters import procs
from provision.core.errors import BuildFailed, ToolMissing

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


def _stderr_progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def require_tools(tools: tuple[str, ...], *, variant: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
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
    tail: deque[str] = deque(maxlen=25)
    last_report = 0.0
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        # On the owned process tree: cmake, ninja and the compilers die with a killed provision.
        run_dir = procs.job_dir()
        proc = procs.spawn(cmd, run_dir, f"cmake-{name}", stdout=procs.PIPE, stderr=procs.STDOUT,
                           text=True, errors="replace", env=env)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                line = line.rstrip()
                tail.append(line)
                match = _NINJA_PROGRESS.match(line)
                now = time.monotonic()
                if match and (now - last_report > 5 or match.group(1) == match.group(2)):
                    last_report = now
                    progress(f"ggml {plan.variant}: [{match.group(1)}/{match.group(2)}] {match.group(3)[:100]}")
            rc = proc.wait()
        finally:
            procs.finish(proc, run_dir)
    seconds = time.monotonic() - started
    if rc != 0:
        raise BuildFailed(
            f"ggml {plan.variant} build: step '{name}' failed (exit {rc}) after {seconds:.0f} s; "
            f"log {log}\n" + "\n".join(tail),
            fix=f"read {log}; rerun with `provision ggml build --variant {plan.variant}` once fixed",
        )
    return seconds


def run(plan: BuildPlan, *, log: Path, progress: Progress = _stderr_progress,
        env: dict[str, str] | None = None) -> dict[str, float]:
    """Configure (only when the build dir has no build.ninja yet) and build the named targets."""
    timings: dict[str, float] = {}
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
