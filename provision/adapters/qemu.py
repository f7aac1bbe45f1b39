"""QEMU: what it can do (probed) and the command line for one guest (built as data).

The command line is a pure function of a ``VmSpec`` so tests and ``--dry-run`` can show
it; probing runs ``qemu-system-x86_64 -device virtio-gpu-gl-pci,help`` and
``-display help`` in the host-tools tree, because property names are the contract.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from provision.adapters import runner
from provision.core.diagnostics import Check
from provision.core.errors import ToolMissing

# Turns a QEMU command line into the one that runs it where QEMU lives (e.g. through chroot).
Wrap = Callable[[list[str]], list[str]]

BINARY = "qemu-system-x86_64"
GPU_DEVICE = "virtio-gpu-gl-pci"
GPU_PROPERTIES = ("venus", "blob", "hostmem")


@dataclass(frozen=True)
class Capabilities:
    gpu_device: bool
    gpu_properties: frozenset[str]
    displays: frozenset[str]
    version: str

    def as_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "gpu_device": self.gpu_device,
            "gpu_properties": sorted(self.gpu_properties),
            "displays": sorted(self.displays),
        }


def parse_device_help(text: str) -> frozenset[str]:
    """Property names from ``-device X,help`` ("  venus=<bool>  - on/off (default: false)")."""
    return frozenset(m.group(1) for m in re.finditer(r"^\s+([a-z0-9_-]+)=<", text, re.M))


def parse_display_help(text: str) -> frozenset[str]:
    """Backends from ``-display help`` (a header line, then one name per line)."""
    names = set()
    for line in text.splitlines():
        line = line.strip()
        if line and re.fullmatch(r"[a-z0-9-]+", line):
            names.add(line)
    return frozenset(names)


def _qemu(wrap: Wrap, *args: str) -> runner.Done:
    done = runner.run(wrap([BINARY, *args]), timeout=60)
    if done.timed_out:
        raise ToolMissing(f"`{BINARY} {' '.join(args)}` did not answer in 60 s")
    return done


def probe(wrap: Wrap, where: str) -> Capabilities:
    """What the QEMU that ``wrap`` reaches can do; ``where`` names it in errors."""
    ver = _qemu(wrap, "--version")
    if ver.status != 0:
        raise ToolMissing(f"`{BINARY} --version` failed under {where}: {(ver.err or ver.out).strip()[:300]}")
    dev = _qemu(wrap, "-device", f"{GPU_DEVICE},help")
    disp = _qemu(wrap, "-display", "help")
    first = ver.out.splitlines()[0] if ver.out else ""
    m = re.search(r"version (\S+)", first)
    return Capabilities(
        gpu_device=dev.status == 0,
        gpu_properties=parse_device_help(dev.out + dev.err) if dev.status == 0 else frozenset(),
        displays=parse_display_help(disp.out),
        version=m.group(1) if m else first,
    )


def capability_checks(caps: Capabilities, *, fix: str) -> list[Check]:
    out = [Check("host-tools.qemu-version", "ok", caps.version)]
    if not caps.gpu_device:
        out.append(
            Check(
                "host-tools.qemu-gpu",
                "fail",
                f"QEMU {caps.version} has no {GPU_DEVICE} (package qemu-system-modules-opengl)",
                fix=fix,
            )
        )
        return out
    missing = [p for p in GPU_PROPERTIES if p not in caps.gpu_properties]
    if missing:
        out.append(
            Check(
                "host-tools.qemu-gpu",
                "fail",
                f"{GPU_DEVICE} of QEMU {caps.version} lacks {', '.join(missing)} (needs QEMU >= 9.2)",
                fix=fix,
            )
        )
    else:
        out.append(Check("host-tools.qemu-gpu", "ok", f"{GPU_DEVICE} with {', '.join(GPU_PROPERTIES)}"))
    if {"egl-headless", "sdl"} & caps.displays:
        out.append(Check("host-tools.qemu-display", "ok", ", ".join(sorted(caps.displays))))
    else:
        out.append(
            Check(
                "host-tools.qemu-display",
                "fail",
                f"no GL display backend (have {', '.join(sorted(caps.displays)) or 'none'}); "
                "sdl comes with qemu-system-gui",
                fix=fix,
            )
        )
    return out


# --- the command line ----------------------------------------------------------------------


@dataclass(frozen=True)
class Drive:
    path: str
    serial: str
    readonly: bool = True


@dataclass(frozen=True)
class Forward:
    """One TCP port of the guest published on a host address (QEMU user networking).

    The guest gets a NIC only for this: ``restrict=on`` cuts it off from the host and the
    outside, and the forward listens on ``host_addr`` alone (loopback unless the user chose).
    """

    host_addr: str
    host_port: int
    guest_port: int


@dataclass(frozen=True)
class VmSpec:
    """Everything that decides a QEMU command line; paths are as QEMU sees them."""

    kernel: str
    initrd: str
    root: Drive
    drives: tuple[Drive, ...]
    console_log: str
    stdout_log: str
    stderr_log: str
    accel: str = "tcg"
    memory_mib: int = 2048
    cpus: int = 2
    gpu: bool = False
    hostmem_mib: int = 2048
    display: str = "none"  # "egl-headless", "sdl" or "none"
    append_extra: tuple[str, ...] = field(default_factory=tuple)
    quiet: bool = True  # False shows the kernel's boot messages in console.log
    # QEMU's seccomp filter (``-sandbox``); provision/core/isolation.py picks it. None: no filter.
    sandbox: str | None = None
    forward: Forward | None = None  # None: the guest has no network device at all (network_args)
    terminal: str | None = None  # a host tty (pty slave) for ttyS1 instead of the stdout file


def kernel_cmdline(spec: VmSpec) -> str:
    # ro: the root disk is shared by concurrent VMs and never written. panic=-1 turns a
    # dying init into a reset, which -no-reboot turns into QEMU exiting.
    parts = [
        "console=ttyS0",
        "root=/dev/vda",
        "ro",
        "rootwait",
        "panic=-1",
        "init=/usr/local/libexec/krun-gpu/init",
    ]
    if spec.quiet:
        parts.append("quiet")
    return " ".join([*parts, *spec.append_extra])


def network_args(spec: VmSpec) -> list[str]:
    """The guest's network: none at all (no NIC, so only ``lo`` inside) unless serve forwards a port."""
    return ["-nic", "none"] if spec.forward is None else netdev_args(spec.forward)


def argv(spec: VmSpec) -> list[str]:
    """The QEMU command line for ``spec`` (pure)."""
    accel = ["-accel", "kvm", "-cpu", "host"] if spec.accel == "kvm" else ["-accel", "tcg,thread=multi", "-cpu", "max"]
    out = [
        BINARY,
        *accel,
        "-m",
        str(spec.memory_mib),
        "-smp",
        str(spec.cpus),
        "-nodefaults",
        "-no-reboot",
        "-no-user-config",
    ]
    if spec.sandbox:
        out += ["-sandbox", spec.sandbox]
    out += network_args(spec)
    if spec.gpu:
        # Venus maps host memory into the guest: the RAM must be a shareable memfd.
        out += [
            "-object",
            f"memory-backend-memfd,id=mem,size={spec.memory_mib}M,share=on",
            "-machine",
            "q35,memory-backend=mem",
            "-device",
            f"{GPU_DEVICE},venus=on,blob=on,hostmem={spec.hostmem_mib}M",
        ]
        out += ["-display", "egl-headless" if spec.display == "egl-headless" else "sdl,gl=on"]
    else:
        out += ["-machine", "q35", "-display", "none"]
    # ttyS0: kernel console + init's status lines; ttyS1/ttyS2: the command's stdout/stderr.
    if spec.terminal is not None and not re.fullmatch(r"/[\w./-]+", spec.terminal):
        raise ValueError(f"terminal must be a plain device path: {spec.terminal!r}")
    # With a terminal, ttyS1 is that tty (provision shell): the guest's shell reads and writes it.
    for cid, path in (("con", spec.console_log), ("out", spec.stdout_log), ("err", spec.stderr_log)):
        backend = "serial" if cid == "out" and spec.terminal else "file"
        target = spec.terminal if backend == "serial" else path
        out += ["-chardev", f"{backend},id={cid},path={target}", "-serial", f"chardev:{cid}"]
    out += ["-kernel", spec.kernel, "-initrd", spec.initrd, "-append", kernel_cmdline(spec)]
    for i, d in enumerate((spec.root, *spec.drives)):
        ro = ",readonly=on" if d.readonly else ""
        out += [
            "-drive",
            f"file={d.path},format=raw,if=none,id=d{i}{ro}",
            "-device",
            f"virtio-blk-pci,drive=d{i},serial={d.serial}",
        ]
    return out


def netdev_args(fwd: Forward) -> list[str]:
    """A virtio NIC whose only reachable service is ``fwd`` (guest 10.0.2.15, QEMU's default)."""
    for port in (fwd.host_port, fwd.guest_port):
        if not 0 < port < 65536:
            raise ValueError(f"port {port} out of range")
    if not re.fullmatch(r"\d{1,3}(\.\d{1,3}){3}", fwd.host_addr):
        raise ValueError(f"host address must be a numeric IPv4 address: {fwd.host_addr!r}")
    return [
        "-netdev",
        f"user,id=net0,restrict=on,ipv6=off,hostfwd=tcp:{fwd.host_addr}:{fwd.host_port}-:{fwd.guest_port}",
        "-device",
        "virtio-net-pci,netdev=net0",
    ]
