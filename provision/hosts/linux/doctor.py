"""Doctor checks for the Linux route's host tools (QEMU + virglrenderer Venus).

Tools are looked for on this host first, then in the sid chroot that
``provision host-tools`` builds (its root in ``PROVISION_HOST_TOOLS``); tools found only
in the chroot are run through ``chroot`` (root only). Every check says what it saw.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import qemu
from provision.adapters.program import run_tool
from provision.core.diagnostics import Check, DoctorContext
from provision.hosts.linux import accel, display
from provision.hosts.linux.bundle_archive import is_bundle

HOST_TOOLS_ENV = "PROVISION_HOST_TOOLS"
QEMU = qemu.BINARY
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "usr/local/lib")
RENDER_SERVER_DIRS = ("usr/libexec", "usr/lib/virglrenderer", "usr/local/libexec")
FIX_TOOLS = "run `provision host-tools` (a Debian sid chroot with QEMU, virglrenderer, virgl-server, Mesa's EGL)"


@dataclass(frozen=True)
class Tool:
    path: Path  # inside ``root`` when root is set
    root: Path | None

    def argv(self, *args: str) -> list[str]:
        if self.root is None:
            return [str(self.path), *args]
        return ["chroot", str(self.root), str(self.path), *args]

    def where(self) -> str:
        return str(self.path) if self.root is None else f"{self.root}{self.path} (chroot)"


def chroot_root(env: dict[str, str]) -> Path | None:
    root = env.get(HOST_TOOLS_ENV)
    if root:
        return Path(root) if Path(root).is_dir() else None
    # No override: the chroot `provision host-tools` made for the current pins, if any.
    from provision.hosts.linux import tools as host_tools

    cached = host_tools.cached_root()
    return cached if (cached / host_tools.READY_STAMP).is_file() else None


def find_program(name: str, env: dict[str, str]) -> Tool | None:
    # Same order as host_tools.locate(), which `provision run` uses: the chroot, then the host.
    root = chroot_root(env)
    if root is not None:
        for d in ("usr/bin", "usr/sbin", "bin", "usr/local/bin"):
            if (root / d / name).is_file():
                return Tool(Path("/") / d / name, root)
    host = shutil.which(name, path=env.get("PATH"))
    return Tool(Path(host), None) if host else None


def find_file(name: str, dirs: tuple[str, ...], env: dict[str, str]) -> Path | None:
    roots = [Path("/")]
    if (root := chroot_root(env)) is not None:
        roots.insert(0, root)
    for r in roots:
        for d in dirs:
            if (r / d / name).exists():
                return r / d / name
    return None


def check_qemu(tool: Tool | None, help_out: tuple[int, str] | None) -> list[Check]:
    if tool is None:
        return [Check("linux.qemu", "fail", f"{QEMU} is not installed here or in ${HOST_TOOLS_ENV}", FIX_TOOLS)]
    out = [Check("linux.qemu", "ok", tool.where())]
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
    qemu_tool = find_program(QEMU, env)
    help_out = None
    if qemu_tool is not None and (qemu_tool.root is None or os.geteuid() == 0):
        help_argv = qemu_tool.argv("-device", f"{qemu.GPU_DEVICE},help")
        help_out = run_tool(help_argv, timeout=60) or (127, "not runnable")
    checks = check_qemu(qemu_tool, help_out)
    checks += check_virglrenderer(
        find_file("libvirglrenderer.so.1", LIB_DIRS, env), find_file("virgl_render_server", RENDER_SERVER_DIRS, env)
    )
    dri = Path("/dev/dri")
    nodes = sorted(str(p) for p in dri.glob("renderD*")) if dri.is_dir() else []
    # QEMU runs inside a chroot's tree, but a bundle's QEMU runs on the host's: its EGL vendors are the host's.
    tree = chroot_root(env)
    checks.append(check_display(nodes, display.egl_vendors(tree if tree and not is_bundle(tree) else Path("/"), env)))
    checks.append(accel.host_decision(with_dmesg=True).check())
    return checks
