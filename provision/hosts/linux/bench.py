"""llama-bench in a guest and on the host, for `provision bench` on the Linux route.

The guest command runs llama-bench once per place (GPU device, CPU) after a section marker
that bench.report splits on; the host run uses the host-tools tree's own llama-bench.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

from provision.adapters import runner
from provision.core.errors import VmFailed
from provision.hosts.linux import tools as host_tools
from provision.hosts.linux.runplan import IN_CHROOT

BENCH_ARGS = ("-p", "256", "-n", "16", "-r", "2", "-o", "json")


def guest_bench_command(device_args: Mapping[str, tuple[str, ...]]) -> list[str]:
    """One guest command running llama-bench once per place, each after a section marker."""
    parts = ["set -e"]
    for where, dev in device_args.items():
        parts.append(f"echo '@@krun-bench {where}'")
        parts.append(
            shlex.join(["llama-bench", "-m", "MODEL_PATH", *dev, *BENCH_ARGS]).replace("MODEL_PATH", '"$MODEL"')
        )
    return ["sh", "-c", "; ".join(parts)]


GUEST_PLACES = {
    "guest-gpu": ("-dev", "Vulkan0", "-ngl", "99"),
    "guest-cpu": ("-dev", "none", "-ngl", "0"),
}


def host_native_bench(model: Path, timeout: float = 600) -> str | None:
    """llama-bench on the host's own Vulkan device (in the host-tools tree), or None without llama.cpp there."""
    tools = host_tools.locate()
    if tools is None or not tools.path("usr/bin/llama-bench").exists():
        return None
    program = ["llama-bench", "-m", f"{IN_CHROOT['model']}/{model.name}", "-dev", "Vulkan0", "-ngl", "99", *BENCH_ARGS]
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    if tools.is_chroot:
        argv = tools.chroot().with_binds({model.resolve().parent: IN_CHROOT["model"]}).argv(program, env)
    else:
        program[2] = str(model)
        argv = program
    done = runner.run(argv, name="llama-bench", timeout=timeout, env=None if tools.is_chroot else {**os.environ, **env})
    if done.status != 0:
        raise VmFailed(f"host llama-bench failed ({done.status}): {done.err.strip()[-500:]}")
    return done.out
