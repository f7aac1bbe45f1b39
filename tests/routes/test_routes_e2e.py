"""Route selection end to end on this host (no render node, no NVIDIA): the real probes choose
Venus on lavapipe with the CPU warning, and `provision run --gpu -- vulkaninfo --summary` with no
stack boots llama-linux (QEMU TCG + virglrenderer Venus + lavapipe) and says why first."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision import hosts
from provision.core import catalog
from provision.hosts.linux.tools import host_tools
from provision.routes import choose
from tests.helpers import run_provision
from tests.hosts.linux.test_linux_e2e import tools  # noqa: F401  (the chroot and the llama-linux disk)

pytestmark = pytest.mark.slow


def test_this_host_probes_as_venus_on_lavapipe(tools: host_tools.HostTools) -> None:  # noqa: F811
    facts = hosts.native().route_facts()
    assert facts.platform == "linux"
    assert facts.render_nodes == () and not Path("/dev/dri").exists()  # this CI host has no GPU
    assert "lvp_icd.json" in facts.vulkan_icds  # from the host-tools chroot's mesa-vulkan-drivers
    d = choose.choose(facts, catalog.load().stacks, gpu=True)
    assert (d.stack, d.route, d.cpu) == ("llama-linux", "venus", True)


def test_run_gpu_without_a_stack_picks_llama_linux_and_says_why(tools: host_tools.HostTools) -> None:  # noqa: F811
    proc = run_provision("run", "--gpu", "--timeout", "1100", "--", "vulkaninfo", "--summary", timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    why = next(i for i, ln in enumerate(lines) if ln.startswith("provision: route: "))
    boot = next(i for i, ln in enumerate(lines) if "qemu pid=" in ln)
    assert why < boot  # said before anything started
    assert lines[why].startswith("provision: route: llama-linux (venus) on lavapipe (CPU): no render node")
    assert "WARNING: lavapipe is a CPU, not a GPU" in lines[why]
    # and it really ran there: the guest sees Venus
    assert "DRIVER_ID_MESA_VENUS" in proc.stdout and "Virtio-GPU Venus" in proc.stdout, proc.stdout[-2000:]
