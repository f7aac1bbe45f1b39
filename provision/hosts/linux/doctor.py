"""Doctor checks for the Linux route's host tools (QEMU + virglrenderer Venus).

The tools are found by ``tools.locate`` and the accelerator is picked by ``accel.for_run``,
the same two functions `provision run` uses, with the command's settings and the environment
doctor was given: the cached chroot, an installed ``--from`` bundle, the settings ``host_tools``
and ``accel`` count exactly as they do for a run. QEMU is asked what it supports
through ``HostTools.wrap``, as a run starts it (a chroot's needs root). Every check says
what it saw.
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.adapters import qemu, runner
from provision.core.diagnostics import Check, DoctorContext
from provision.hosts.linux.run import accel, display
from provision.hosts.linux.tools import host_tools

HOST_TOOLS_ENV = host_tools.ENV_VAR
QEMU = qemu.BINARY
FIX_TOOLS = "run `provision host-tools` (a Debian sid chroot with QEMU, virglrenderer, virgl-server, Mesa's EGL)"


def _where(tools: host_tools.HostTools, path: Path) -> str:
    kind = " (chroot)" if tools.is_chroot else " (bundle)" if tools.bundle else ""
    return f"{path}{kind}"


def check_qemu(tools: host_tools.HostTools | None, path: Path | None, help_out: tuple[int, str] | None) -> list[Check]:
    if tools is None or path is None:
        seen = "no host tools found" if tools is None else f"not in {tools.root} ({tools.source})"
        return [Check("linux.qemu", "fail", f"{QEMU}: {seen}", FIX_TOOLS)]
    out = [Check("linux.qemu", "ok", _where(tools, path))]
    if help_out is None:
        out.append(
            Check(
                "linux.qemu.virtio-gpu-gl",
                "warn",
                "QEMU is in a chroot and this user cannot chroot",
                "run provision doctor as root",
            )
        )
        return out
    props = qemu.parse_device_help(help_out[1])
    missing = [p for p in qemu.GPU_PROPERTIES if p not in props]
    if help_out[0] != 0 or not props:
        last = (help_out[1].strip().splitlines() or ["no output"])[-1]
        out.append(
            Check(
                "linux.qemu.virtio-gpu-gl",
                "fail",
                f"{qemu.GPU_DEVICE} unavailable: {last}",
                "install QEMU's OpenGL module (Debian: qemu-system-modules-opengl) " + "or " + FIX_TOOLS,
            )
        )
    elif missing:
        out.append(
            Check(
                "linux.qemu.virtio-gpu-gl",
                "fail",
                f"{qemu.GPU_DEVICE} lacks {', '.join(missing)}: QEMU too old for Venus",
                "QEMU >= 9.2 has venus/blob/hostmem; " + FIX_TOOLS,
            )
        )
    else:
        out.append(Check("linux.qemu.virtio-gpu-gl", "ok", f"{qemu.GPU_DEVICE} has {', '.join(qemu.GPU_PROPERTIES)}"))
    return out


def check_virglrenderer(lib: Path | None, server: Path | None) -> list[Check]:
    return [
        Check("linux.virglrenderer", "ok", str(lib))
        if lib
        else Check(
            "linux.virglrenderer",
            "fail",
            "libvirglrenderer.so.1 not found",
            "apt install libvirglrenderer1, or " + FIX_TOOLS,
        ),
        Check("linux.virgl-render-server", "ok", str(server))
        if server
        else Check(
            "linux.virgl-render-server",
            "fail",
            "virgl_render_server not found (Venus runs in it)",
            "apt install virgl-server, or " + FIX_TOOLS,
        ),
    ]


def check_display(render_nodes: list[str], vendors: list[display.EglVendor]) -> Check:
    """Which GL context QEMU will get: a render node's, or SDL offscreen on the first EGL vendor."""
    if render_nodes:
        return Check("linux.display", "ok", f"render node {render_nodes[0]}: -display egl-headless")
    if vendors:
        return Check(
            "linux.display",
            "ok",
            f"no render node; -display sdl,gl=on with SDL_VIDEODRIVER=offscreen on EGL vendor {vendors[0].describe()}",
        )
    return Check(
        "linux.display",
        "fail",
        "no /dev/dri render node and no EGL vendor manifest: QEMU has no GL context for virglrenderer",
        f"name the GPU driver's manifest: export {display.VENDOR_ENV}=/path/to/10_nvidia.json, "
        "or apt install libegl-mesa0, or " + FIX_TOOLS,
    )


def linux_checks(ctx: DoctorContext) -> list[Check]:
    env = ctx.env
    tools = host_tools.locate(env=env)
    qemu_path = host_tools.find(tools, host_tools.QEMU, env) if tools else None
    help_out = None
    if tools is not None and qemu_path is not None and (not tools.is_chroot or os.geteuid() == 0):
        inside = "/" + host_tools.QEMU if tools.is_chroot else str(qemu_path)
        help_argv = tools.wrap([inside, "-device", f"{qemu.GPU_DEVICE},help"])
        help_out = runner.probe(help_argv, timeout=60) or (127, "not runnable")
    checks = check_qemu(tools, qemu_path, help_out)
    lib = host_tools.find(tools, host_tools.VIRGL_LIB_GLOB, env) if tools else None
    server = host_tools.find(tools, host_tools.RENDER_SERVER, env) if tools else None
    checks += check_virglrenderer(lib, server)
    dri = Path("/dev/dri")
    nodes = sorted(str(p) for p in dri.glob("renderD*")) if dri.is_dir() else []
    # QEMU runs inside a chroot's tree, but a bundle's QEMU runs on the host's: its EGL vendors are the host's.
    tree = tools.root if tools is not None and tools.is_chroot else Path("/")
    checks.append(check_display(nodes, display.egl_vendors(tree, env)))
    checks.append(accel.for_run(with_dmesg=True).check())
    return checks
