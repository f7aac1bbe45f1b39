"""The traps Mac users fall into, each a doctor check that names its fix (issue 29; peers-2026-12.md §1.3-1.5, §3.1).

1. the podman machine's provider is not libkrun (applehv: no GPU at all; RamaLama #857);
2. krunkit is absent, or older than this podman needs (podman #25158; #29439 `--timesync`),
   by the table in pins.json ``compat.podman_krunkit``;
3. the machine's RAM leaves the GPU window too small for the model (krunkit caps RAM at
   ``compat.krunkit_memory.max_ram_mib`` and maps VRAM = min(63488 − RAM rounded, host RAM));
4. the guest's Vulkan device is llvmpipe, not Venus (the image lacks the COPR Mesa);
5. the guest kernel is older than 5.16 (Venus needs it: krunkit #50);
6. the APIR variables are set for a Venus machine (Venus is off while they are).

``checks(facts, compat)`` is pure (tested on recorded outputs in tests/data/macos/traps/);
``gather`` runs podman, krunkit and the guest through a runner the tests replace.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.adapters import podman_machine, runner
from provision.core import paths
from provision.core.diagnostics import Check, DoctorContext
from provision.hosts.darwin import machine_state, versions
from provision.hosts.darwin.guest_checks import parse_vulkaninfo_summary
from provision.hosts.darwin.podman_checks import (
    APIR_OPTIONAL,
    APIR_REQUIRED,
    containers_conf_files,
    find_helper,
    read_containers_conf,
)

Runner = Callable[[Sequence[str]], "tuple[int, str] | None"]
VENUS_MIN_KERNEL = (5, 16)  # krunkit #50: the guest kernel Venus needs (virtio-gpu blob + context init)


@dataclass(frozen=True)
class MacFacts:
    machine: str
    inspect: str | None = None  # `podman machine inspect NAME`, the user's own provider
    podman_version: str | None = None  # `podman --version`
    krunkit_version: str | None = None  # `krunkit --version` of the krunkit podman would run; None: none found
    host_ram_mib: int | None = None
    model_mib: int | None = None  # the largest model meant to run (default: the store's largest)
    guest_kernel: str | None = None  # `uname -r` in the machine
    guest_vulkan: str | None = None  # `vulkaninfo --summary` in a --device /dev/dri container
    env: dict[str, str] = field(default_factory=dict)
    machine_route: str | None = None  # the route `provision launch` last started the machine with


@dataclass(frozen=True)
class Machine:
    name: str
    provider: str | None  # from ConfigDir (…/podman/machine/<provider>)
    memory_mib: int | None


def parse_machine(inspect: str, name: str) -> Machine | None:
    try:
        rows = json.loads(inspect or "[]")
    except ValueError:
        return None
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("Name") != name:
            continue
        config = str((row.get("ConfigDir") or {}).get("Path") or "")
        provider = Path(config).name or None
        info = podman_machine.parse_inspect(json.dumps([row]))[0]
        return Machine(name, provider, info.memory_mib)
    return None


def vram_window_mib(ram_mib: int, host_ram_mib: int | None, limits: dict[str, Any]) -> int:
    """krunkit 1.3.1 src/context.rs: rounded = (RAM / 1024 + 1) * 1024; VRAM = min(63488 − rounded, host RAM)."""
    rounded = (ram_mib // 1024 + 1) * 1024
    window = int(limits["vram_window_mib"]) - rounded
    return min(window, host_ram_mib) if host_ram_mib is not None else window


def check_provider(facts: MacFacts, m: Machine | None) -> Check:
    if m is None:
        return Check("trap.provider", "skip", f"no podman machine {facts.machine!r} under podman's own provider")
    if m.provider == "libkrun":
        return Check("trap.provider", "ok", f"machine {m.name} runs on libkrun")
    return Check(
        "trap.provider", "fail",
        f"machine {m.name} runs on {m.provider or 'an unknown provider'}, not libkrun: the guest gets no GPU "
        "(no /dev/dri, llama.cpp silently on the CPU)",
        f"podman machine rm {m.name}; CONTAINERS_MACHINE_PROVIDER=libkrun podman machine init --provider libkrun "
        f"{m.name} (or `provision launch`, which uses libkrun)",
    )  # fmt: skip


def check_krunkit(facts: MacFacts, compat: dict[str, Any]) -> Check:
    try:
        podman = versions.parse_podman(facts.podman_version) if facts.podman_version else None
    except ValueError:
        podman = None
    if facts.krunkit_version is None:
        return Check(
            "trap.krunkit", "fail",
            f"podman {podman or '?'} finds no krunkit: a libkrun machine cannot start "
            '(exec: "krunkit": executable file not found)',
            "nix profile add .#krun, then `provision launch` (sets CONTAINERS_HELPER_BINARY_DIR to the bundle's bin/)",
        )  # fmt: skip
    try:
        krunkit = versions.parse_krunkit(facts.krunkit_version)
    except ValueError as exc:
        return Check("trap.krunkit", "fail", str(exc), "reinstall krunkit: nix profile add .#krun")
    if podman is not None:
        for rule in compat["podman_krunkit"]:
            need = versions.Version.parse(rule["krunkit_min"])
            if podman >= versions.Version.parse(rule["podman_min"]) and krunkit < need:
                return Check(
                    "trap.krunkit", "fail",
                    f"podman {podman} with krunkit {krunkit}: {rule['why']}",
                    f"krunkit >= {need} for podman >= {rule['podman_min']} (pins.json compat.podman_krunkit): "
                    "nix profile add .#krun, then `provision launch`",
                )  # fmt: skip
    return Check("trap.krunkit", "ok", f"krunkit {krunkit} pairs with podman {podman or '?'}")


def check_gpu_window(facts: MacFacts, m: Machine | None, compat: dict[str, Any]) -> Check:
    limits = compat["krunkit_memory"]
    if m is None or m.memory_mib is None:
        return Check("trap.gpu-window", "skip", "no machine memory to check")
    ram, max_ram = m.memory_mib, int(limits["max_ram_mib"])
    if ram > max_ram:
        return Check(
            "trap.gpu-window", "fail", f"machine {m.name}: RAM {ram} MiB is over krunkit's cap of {max_ram} MiB",
            f"provision launch --memory {max_ram} (krunkit refuses more: pins.json compat.krunkit_memory.max_ram_mib)",
        )  # fmt: skip
    window = vram_window_mib(ram, facts.host_ram_mib, limits)
    if facts.model_mib is None:
        return Check("trap.gpu-window", "ok", f"machine {m.name}: {ram} MiB RAM, GPU window {window} MiB (no model)")
    model = facts.model_mib
    if model <= window:
        return Check("trap.gpu-window", "ok", f"machine {m.name}: {model} MiB model fits the {window} MiB GPU window")
    evidence = (
        f"machine {m.name}: RAM {ram} MiB leaves a GPU window of {window} MiB "
        f"(min({limits['vram_window_mib']} - RAM rounded up, host RAM)), the model needs {model} MiB"
    )
    best = (((int(limits["vram_window_mib"]) - model) // 1024) - 1) * 1024
    if best < 2048 or (facts.host_ram_mib is not None and model > facts.host_ram_mib):
        return Check("trap.gpu-window", "fail", evidence, "a smaller (more quantized) model: this one cannot fit")
    return Check(
        "trap.gpu-window", "fail", evidence,
        f"provision launch --memory {best} (every GiB of guest RAM is a GiB less of GPU window)",
    )  # fmt: skip


def check_guest_vulkan(facts: MacFacts) -> Check:
    if facts.guest_vulkan is None:
        return Check("trap.guest-vulkan", "skip", "no guest Vulkan listing (provision doctor --guest-image IMAGE)")
    devices = parse_vulkaninfo_summary(facts.guest_vulkan)
    if any(d.venus for d in devices):
        names = ", ".join(d.name for d in devices if d.venus)
        return Check("trap.guest-vulkan", "ok", f"guest Vulkan device is Venus: {names}")
    listing = ", ".join(f"{d.name} [{d.driver_id}]" for d in devices) or "no device"
    return Check(
        "trap.guest-vulkan", "fail",
        f"the guest's Vulkan device is {listing}, not Venus: llama.cpp runs on the CPU",
        "the image lacks the COPR Mesa (slp/mesa-libkrun-vulkan): use `provision image build llama` and run it "
        "with --device /dev/dri (provision run llama --gpu)",
    )  # fmt: skip


_KERNEL = re.compile(r"^\s*(\d+)\.(\d+)")


def check_guest_kernel(facts: MacFacts) -> Check:
    if facts.guest_kernel is None:
        return Check("trap.guest-kernel", "skip", "machine not running: no guest kernel to read")
    m = _KERNEL.match(facts.guest_kernel)
    if not m:
        return Check("trap.guest-kernel", "warn", f"cannot read a version in {facts.guest_kernel.strip()[:80]!r}")
    release = facts.guest_kernel.strip().splitlines()[0]
    if (int(m.group(1)), int(m.group(2))) >= VENUS_MIN_KERNEL:
        return Check("trap.guest-kernel", "ok", f"guest kernel {release}")
    need = ".".join(map(str, VENUS_MIN_KERNEL))
    return Check(
        "trap.guest-kernel", "fail", f"guest kernel {release} is older than {need}: Venus cannot start (krunkit #50)",
        f"recreate the machine on a current image: podman machine rm {facts.machine}; "
        f"podman machine init --provider libkrun {facts.machine} (kernel >= {need})",
    )  # fmt: skip


def check_apir_on_venus(facts: MacFacts) -> Check:
    set_vars = [k for k in (*APIR_REQUIRED, *APIR_OPTIONAL) if facts.env.get(k)]
    if facts.machine_route == "apir":
        return Check("trap.apir-env", "ok", f"machine {facts.machine} was started for APIR")
    if not set_vars:
        return Check("trap.apir-env", "ok", "no APIR variables set for this Venus machine")
    return Check(
        "trap.apir-env", "fail",
        f"{', '.join(set_vars)} set, but machine {facts.machine} is a Venus machine "
        f"({facts.machine_route or 'no APIR launch recorded'}): a krunkit started from here has no Venus",
        f"unset {' '.join(set_vars)}; then `provision launch --route venus` (or --route apir for APIR)",
    )  # fmt: skip


def checks(facts: MacFacts, compat: dict[str, Any]) -> list[Check]:
    m = parse_machine(facts.inspect, facts.machine) if facts.inspect else None
    return [
        check_provider(facts, m),
        check_krunkit(facts, compat),
        check_gpu_window(facts, m, compat),
        check_guest_vulkan(facts),
        check_guest_kernel(facts),
        check_apir_on_venus(facts),
    ]


# --- probing ---------------------------------------------------------------------------------


def largest_model_mib() -> int | None:
    blobs = paths.cache_root() / "models" / "blobs"
    sizes = [p.stat().st_size for p in blobs.rglob("*") if p.is_file()] if blobs.is_dir() else []
    return max(sizes) // (1 << 20) if sizes else None


def host_ram_mib() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return None


def gather(ctx: DoctorContext, run: Runner = runner.probe) -> MacFacts:
    machine = ctx.machine or podman_machine.DEFAULT_MACHINE
    podman = runner.found("podman", path=ctx.env.get("PATH")) or "podman"
    pv = run([podman, "--version"])
    conf = read_containers_conf(containers_conf_files(ctx.env, ctx.home))
    krunkit, _ = find_helper("krunkit", ctx.env, conf, Path(podman).resolve().parent)
    kv = run([str(krunkit), "--version"]) if krunkit else None
    inspect = run([podman, "machine", "inspect", machine])
    m = parse_machine(inspect[1], machine) if inspect and inspect[0] == 0 else None
    kernel = run([podman, "machine", "ssh", machine, "uname", "-r"]) if m is not None else None
    vulkan = None
    if ctx.guest_image:
        vulkan = run([podman, "run", "--rm", "--device", "/dev/dri", ctx.guest_image, "vulkaninfo", "--summary"])
    return MacFacts(
        machine=machine,
        inspect=inspect[1] if inspect and inspect[0] == 0 else None,
        podman_version=pv[1] if pv and pv[0] == 0 else None,
        krunkit_version=kv[1] if kv and kv[0] == 0 else None,
        host_ram_mib=ctx.extras.get("host_ram_mib") or host_ram_mib(),
        model_mib=ctx.extras.get("model_mib") or largest_model_mib(),
        guest_kernel=kernel[1] if kernel and kernel[0] == 0 else None,
        guest_vulkan=vulkan[1] if vulkan else None,
        env=ctx.env,
        machine_route=machine_state.recorded_route(machine),
    )


def trap_checks(ctx: DoctorContext, run: Runner = runner.probe) -> list[Check]:
    return checks(gather(ctx, run), ctx.compat)
