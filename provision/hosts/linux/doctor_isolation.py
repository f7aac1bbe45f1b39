"""Doctor checks: the isolation a Linux guest gets on this host (provision/core/isolation.py), as evidence.

QEMU's seccomp sandbox, the user QEMU, and the render server run as, the guest's
network, which disks are read-only and the limits a run gets. The sandbox, network, disk
and limit rows are read from QEMU command lines planned by runplan.plan_run (what every
run is planned with) for the tools this host has: a change that loses ``-nic none`` or
``readonly=on`` turns its row into a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.core import isolation
from provision.core.diagnostics import Check, DoctorContext
from provision.hosts import RunRequest
from provision.hosts.linux.run.runplan import HostFacts, RunPlan, plan_run
from provision.hosts.linux.tools import guest_user
from provision.hosts.linux.tools.host_tools import HostTools
from provision.images.disks import RootDisk


def user_check(euid: int, tools_root: Path | None, is_chroot: bool) -> Check:
    cid = "linux.isolation.user"
    if euid != 0:
        return Check(cid, "ok", f"provision is not root: QEMU and the render server run as uid {euid} (you)")
    if tools_root is None or not is_chroot:
        return Check(
            cid,
            "warn",
            "provision is root and its host tools are not a chroot (the host's own QEMU, or a `--from` bundle): "
            "QEMU and the render server run as root",
            fix="run provision as a normal user (the host's QEMU and a bundle need no root), "
            "or use `provision host-tools` (its chroot drops them to the unprivileged krun-guest user)",
        )
    ids = guest_user.user_in_tree(tools_root)
    who = f"uid {ids[0]}, gid {ids[1]}" if ids else "added at the next run"
    return Check(
        cid,
        "ok",
        f"QEMU and the render server drop from root to {isolation.GUEST_USER} ({who}) with no_new_privs "
        "before they start",
    )


def _sample_plans(tools: HostTools) -> dict[str, RunPlan]:
    """A CPU and a GPU plan from runplan.plan_run, the function every run is planned with."""
    from provision.core import catalog

    stack = catalog.load().get("llama-linux")
    where = Path("/nonexistent/krun-doctor")  # only named in the plans, never touched
    root = RootDisk(where / "vm/root.img", where / "vm/vmlinuz", where / "vm/initrd.img", "")
    plans = {}
    for kind, gpu in (("cpu", False), ("gpu", True)):
        req = RunRequest(stack, gpu, ("true",))
        facts = HostFacts(tools, "tcg", render_node=False, root=root, run_dir=where / "run", model_disk=where / "m.img")
        plans[kind] = plan_run(req, facts)
    return plans


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def plan_checks(plans: dict[str, RunPlan]) -> list[Check]:
    """What the planned QEMU command lines say about isolation (not what the docs say)."""
    cpu, gpu = plans["cpu"].qemu_argv, plans["gpu"].qemu_argv
    sandboxes = {k: _after(a, "-sandbox") for k, a in (("CPU", cpu), ("GPU", gpu))}
    if all(sandboxes.values()):
        sandbox = Check("linux.isolation.sandbox", "ok", "; ".join(
            f"{k} guests: QEMU -sandbox {v[0]}" for k, v in sandboxes.items()))
    else:
        bare = ", ".join(k for k, v in sandboxes.items() if not v)
        sandbox = Check("linux.isolation.sandbox", "fail", f"{bare} guests' QEMU has no -sandbox",
                        "provision/core/isolation.py sandbox_option must give every guest a seccomp filter")
    nics = {tuple(_after(a, "-nic")) for a in (cpu, gpu)} | {tuple(_after(a, "-netdev")) for a in (cpu, gpu)}
    if nics == {("none",), ()}:
        network = Check("linux.isolation.network", "ok", "run guests get -nic none (no NIC: only lo inside); "
                        "serve alone forwards one port (restrict=on user networking)")
    else:
        network = Check("linux.isolation.network", "fail", f"run guests' QEMU has a network: {sorted(nics)}",
                        "provision/adapters/qemu.py network_args: a run's guest gets -nic none")
    drives = _after(cpu, "-drive") + _after(gpu, "-drive")
    writable = [d for d in drives if "readonly=on" not in d.split(",")]
    if drives and not writable:
        mounts = Check("linux.isolation.mounts", "ok", f"all {len(drives) // 2} disks (root, job, model) are "
                       "-drive …,readonly=on; QEMU writes only its three serial logs")
    else:
        mounts = Check("linux.isolation.mounts", "fail", f"writable disks: {writable or 'no disks at all'}",
                       "provision/adapters/qemu.py: every -drive gets readonly=on")
    c, g = plans["cpu"], plans["gpu"]
    limits = Check(
        "linux.isolation.limits",
        "ok",
        f"run time {c.timeout_s:g} s, {c.spec.cpus} CPUs, {c.spec.memory_mib} MiB ({g.spec.memory_mib} MiB with GPU) "
        "unless --timeout/--cpus/--memory say otherwise",
    )
    return [sandbox, network, mounts, limits]


def isolation_checks(ctx: DoctorContext) -> list[Check]:
    from provision.hosts.linux.tools import host_tools

    tools = host_tools.locate(env=ctx.env)
    user = user_check(os.geteuid(), tools.root if tools else None, bool(tools and tools.is_chroot))
    return [*plan_checks(_sample_plans(tools or host_tools.HostTools(Path("/"), "host"))), user]
