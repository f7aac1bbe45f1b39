"""Guest checks: run one script inside a container on the machine, parse what it printed.

Pure parsers over real output texts (``ls /dev/dri``, ``rpm -q``, ``vulkaninfo --summary``,
the Mesa/krun error lines), so they are tested on recorded output and run unchanged on a Mac.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from provision.core.diagnostics import Check

# One container run, sections separated by marker lines; every command's stderr is kept
# because the 16 KiB failure only shows up there.
MARK = "@@provision:"
GUEST_SCRIPT = "; ".join(
    [
        f"echo {MARK}dri",
        "ls /dev/dri 2>&1",
        f"echo {MARK}rpm",
        "rpm -q mesa-vulkan-drivers 2>&1",
        f"echo {MARK}vulkaninfo",
        "vulkaninfo --summary 2>&1",
        f"echo {MARK}end",
    ]
)


def split_sections(text: str) -> dict[str, str]:
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith(MARK):
            current = line[len(MARK) :].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


@dataclass(frozen=True)
class VkDevice:
    name: str
    driver_id: str
    device_type: str

    @property
    def venus(self) -> bool:
        return self.driver_id == "DRIVER_ID_MESA_VENUS"

    @property
    def llvmpipe(self) -> bool:
        return self.driver_id == "DRIVER_ID_MESA_LLVMPIPE"


_KV = re.compile(r"^\s*(deviceName|driverID|deviceType)\s*=\s*(.*?)\s*$")


def parse_vulkaninfo_summary(text: str) -> list[VkDevice]:
    """Devices from ``vulkaninfo --summary`` (GPU0:, GPU1: blocks of ``key = value`` lines)."""
    devices: list[VkDevice] = []
    cur: dict[str, str] | None = None
    for line in text.splitlines():
        if re.match(r"^GPU\d+:\s*$", line.strip()):
            if cur is not None:
                devices.append(VkDevice(cur.get("deviceName", ""), cur.get("driverID", ""), cur.get("deviceType", "")))
            cur = {}
        elif cur is not None and (m := _KV.match(line)):
            cur[m.group(1)] = m.group(2)
    if cur is not None:
        devices.append(VkDevice(cur.get("deviceName", ""), cur.get("driverID", ""), cur.get("deviceType", "")))
    return devices


# Stock Mesa on Apple Silicon: blobs aligned to 4 KiB cannot be hv_vm_map'ed (16 KiB pages).
_OOHM = re.compile(r"ERROR_OUT_OF_HOST_MEMORY|ErrorOutOfHostMemory|Error adding memory map: MemoryMap|map_memory err")
_SIXTEEN_K_FIX = (
    "use an image with the 16 KiB-aligned Mesa from COPR slp/mesa-libkrun-vulkan (stack llama); more VRAM does not help"
)


def check_dev_dri(ls_output: str) -> Check:
    names = ls_output.split()
    if any(n.startswith("renderD") for n in names):
        return Check("guest.dev-dri", "ok", f"/dev/dri: {' '.join(names)}")
    return Check(
        "guest.dev-dri",
        "fail",
        f"no render node in /dev/dri ({ls_output.strip() or 'empty'})",
        "run the container with --device /dev/dri (provision run --gpu) on a libkrun machine",
    )


def check_vulkaninfo(summary: str) -> Check:
    if _OOHM.search(summary):
        return Check("guest.vulkan", "fail", "vulkaninfo failed: " + _first_match_line(summary), _SIXTEEN_K_FIX)
    devices = parse_vulkaninfo_summary(summary)
    if not devices:
        tail = " | ".join(summary.strip().splitlines()[-2:]) or "no output"
        return Check(
            "guest.vulkan",
            "fail",
            f"vulkaninfo listed no device: {tail}",
            "install vulkan-tools and the Venus ICD (mesa-vulkan-drivers) in the image",
        )
    listing = "; ".join(f"{d.name} [{d.driver_id}]" for d in devices)
    venus = [d for d in devices if d.venus]
    if not venus:
        only = "only llvmpipe (software Vulkan)" if all(d.llvmpipe for d in devices) else "no Venus device"
        return Check(
            "guest.vulkan",
            "fail",
            f"{only}: {listing}",
            "Venus did not load: check the krunkit route (VIRGL_ROUTE_VENUS_TO_APIR must be unset) and "
            "run VK_LOADER_DEBUG=all vulkaninfo to see which ICD failed",
        )
    if all(d.device_type == "PHYSICAL_DEVICE_TYPE_CPU" for d in venus):
        return Check(
            "guest.vulkan",
            "warn",
            f"Venus runs on a CPU Vulkan on the host: {listing}",
            "expected on a host without a GPU; on a Mac the name shows the Apple GPU",
        )
    return Check("guest.vulkan", "ok", f"Venus: {listing}")


def check_copr_mesa(rpm_output: str, pinned_nevr: str) -> Check:
    out = rpm_output.strip()
    if "not installed" in out or not out.startswith("mesa-vulkan-drivers-"):
        return Check("guest.mesa", "fail", f"rpm -q mesa-vulkan-drivers: {out or 'no output'}", _SIXTEEN_K_FIX)
    if out.startswith(pinned_nevr + ".") or out == pinned_nevr:
        return Check("guest.mesa", "ok", f"{out} (COPR 16 KiB build, pinned {pinned_nevr})")
    return Check(
        "guest.mesa",
        "fail",
        f"{out} is not the pinned COPR build {pinned_nevr}",
        _SIXTEEN_K_FIX + "; stock Fedora Mesa fails with ERROR_OUT_OF_HOST_MEMORY",
    )


def check_host_memory_errors(text: str) -> Check:
    if _OOHM.search(text):
        return Check("guest.16k-alignment", "fail", _first_match_line(text), _SIXTEEN_K_FIX)
    return Check("guest.16k-alignment", "ok", "no ERROR_OUT_OF_HOST_MEMORY / memory-map errors")


def _first_match_line(text: str) -> str:
    for line in text.splitlines():
        if _OOHM.search(line):
            return line.strip()
    return text.strip()[:200]


def guest_checks(output: str, pinned_nevr: str, *, copr_expected: bool) -> list[Check]:
    sec = split_sections(output)
    if "end" not in sec:
        return [
            Check(
                "guest.run",
                "fail",
                "the guest script did not finish: " + output.strip()[-300:],
                "check `podman run --device /dev/dri IMAGE true` by hand",
            )
        ]
    checks = [check_dev_dri(sec.get("dri", "")), check_vulkaninfo(sec.get("vulkaninfo", ""))]
    if copr_expected:
        checks.append(check_copr_mesa(sec.get("rpm", ""), pinned_nevr))
    checks.append(check_host_memory_errors(output))
    return checks
