"""The one accelerator decision for Linux guests: KVM or TCG, and why.

KVM is used only where a stock guest kernel really runs on it: the CPU must expose VMX/SVM.
A /dev/kvm without those flags is a paravirtual KVM (PVM), which only runs guest kernels
built for it (a Debian kernel dies there in the zstd decompressor), so guests run under TCG.
`provision run` takes ``for_run().accel``; `provision doctor` shows that same decision as a check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import runner
from provision.core import settings as settings_mod
from provision.core.diagnostics import Check, Status
from provision.core.errors import ToolMissing

ENV_OVERRIDE = settings_mod.BY_KEY["accel"].env


@dataclass(frozen=True)
class Decision:
    accel: str  # "kvm" or "tcg"
    status: Status  # the doctor check's status: "ok" for KVM, "warn" for TCG
    evidence: str
    fix: str | None = None

    def check(self) -> Check:
        return Check("linux.accel", self.status, self.evidence, self.fix)


def cpu_flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def decide(kvm_exists: bool, kvm_usable: bool, cpuinfo: str, pvm_module: bool = False, dmesg: str = "") -> Decision:
    flags = cpu_flags(cpuinfo)
    if not kvm_exists:
        return Decision("tcg", "warn", "no /dev/kvm: guests run under TCG (slow, but Venus works)",
                        "enable KVM (BIOS virtualization, kvm_intel/kvm_amd) for speed")
    hw = "vmx" if "vmx" in flags else "svm" if "svm" in flags else None
    if hw and kvm_usable:
        return Decision("kvm", "ok", f"/dev/kvm with {hw}: KVM")
    if hw:
        return Decision("tcg", "warn", f"/dev/kvm with {hw}, but this user cannot open it: guests run under TCG",
                        "add the user to the kvm group, or run as root")
    if pvm_module or "kvm-pvm" in dmesg:
        why = "/sys/module/kvm_pvm" if pvm_module else "dmesg kvm-pvm"
        return Decision("tcg", "warn",
                        f"/dev/kvm is PVM ({why}, no vmx/svm): it only runs CONFIG_PVM_GUEST kernels, "
                        "so guests run under TCG",
                        "nothing to do: provision uses -accel tcg here; real KVM needs a host with vmx/svm")
    return Decision("tcg", "warn", "/dev/kvm without vmx/svm flags: guests run under TCG")


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def host_decision(*, with_dmesg: bool = False, root: Path = Path("/")) -> Decision:
    """The decision for this host, read from ``root``'s /proc/cpuinfo, /dev/kvm and /sys (tests
    give a directory laid out the same way)."""
    dmesg = ""
    if with_dmesg:
        try:
            done = runner.run(["dmesg"], timeout=10)
            dmesg = done.out if done.ok else ""
        except (OSError, ToolMissing):
            dmesg = ""
    kvm = root / "dev/kvm"
    return decide(
        kvm.exists(),
        os.access(kvm, os.R_OK | os.W_OK),
        _read(root / "proc/cpuinfo"),
        (root / "sys/module/kvm_pvm").exists(),
        dmesg,
    )


def for_run(
    settings: settings_mod.Settings | None = None, *, with_dmesg: bool = False, root: Path = Path("/")
) -> Decision:
    """The one decision `provision run` acts on and `provision doctor` shows: the setting
    ``accel`` (kvm|tcg; ``settings.current()``'s by default) when set, else what this host supports."""
    s = settings or settings_mod.current()
    override = s.get("accel")
    if override == "kvm" and not (root / "dev/kvm").exists():
        return Decision("kvm", "fail", f"{s.shown('accel')}, but there is no /dev/kvm: QEMU cannot start",
                        f"{s.unset_hint('accel')}, or set it to tcg")
    if override in ("kvm", "tcg"):
        return Decision(override, "ok" if override == "kvm" else "warn",
                        f"{s.shown('accel')}: guests run under {override.upper()}",
                        f"{s.unset_hint('accel')} to let provision decide" if override == "tcg" else None)
    return host_decision(with_dmesg=with_dmesg, root=root)


def host_accelerator(settings: settings_mod.Settings | None = None) -> str:
    """What `provision run` uses (for_run's accelerator)."""
    return for_run(settings).accel
