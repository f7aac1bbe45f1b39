"""The APIR route on a Linux host, as data: the hypervisor's and the guest's environment.

Stock QEMU offers no APIR capset (id 10), so the guest frontend talks over the Venus
capset and our virglrenderer re-routes it (VIRGL_ROUTE_VENUS_TO_APIR=1): that VM gets
APIR, not Venus. Pure: every function maps paths and names to values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from provision.core.errors import ApirBackendRefused

# The guest knob that selects capset 10: with stock QEMU it aborts the guest
# ("failed to initialize the virtgpu APIR capset"), so it is never set on this route.
APIR_CAPSET_ENV = "GGML_REMOTING_USE_APIR_CAPSET"

# The registration symbol of each ggml backend library (ggml_build and the macOS bundle read
# them from here).
KNOWN_REGS = {
    "cpu": "ggml_backend_cpu_reg",
    "vulkan": "ggml_backend_vk_reg",
    "cuda": "ggml_backend_cuda_reg",
    "metal": "ggml_backend_metal_reg",
}


@dataclass(frozen=True)
class HostGgml:
    """The host side: the APIR backend library and the real ggml backend it loads."""

    backend_library: PurePosixPath
    ggml_library: PurePosixPath
    reg: str


@dataclass(frozen=True)
class VirglPrefix:
    """Where our virglrenderer with APIR is installed (inside the host-tools chroot)."""

    root: PurePosixPath

    @property
    def lib(self) -> PurePosixPath:
        return self.root / "lib"

    @property
    def render_server(self) -> PurePosixPath:
        return self.root / "libexec" / "virgl_render_server"


def check_target(host: HostGgml) -> None:
    # llama.cpp's tools hide CPU-type devices, and the remote device takes the type of the
    # host device; the guest then picks the remote CPU device as its own CPU backend and
    # crashes. So a CPU backend cannot be the APIR target.
    name = host.ggml_library.name
    if host.reg == KNOWN_REGS["cpu"] or name.startswith("libggml-cpu"):
        raise ApirBackendRefused(
            f"{host.ggml_library} ({host.reg}) is a CPU backend: the remote device would have type CPU, "
            "which llama.cpp's tools hide (no device listed), and the guest then uses it as its own CPU "
            "backend and crashes",
            fix="use a GPU backend as the APIR target: provision ggml build --variant vulkan "
            "(APIR_LLAMA_CPP_GGML_LIBRARY_PATH=.../libggml-vulkan.so, REG=ggml_backend_vk_reg), or cuda",
        )


def hypervisor_env(prefix: VirglPrefix, host: HostGgml, *, log_dir: PurePosixPath | None = None) -> dict[str, str]:
    """Environment for QEMU (inherited by virglrenderer and its render server)."""
    check_target(host)
    env = {
        # QEMU links libvirglrenderer.so.1; ours has the same soname and adds APIR.
        "LD_LIBRARY_PATH": str(prefix.lib),
        # The render server is exec'd from a compiled-in path; point it at ours.
        "RENDER_SERVER_EXEC_PATH": str(prefix.render_server),
        "VIRGL_ROUTE_VENUS_TO_APIR": "1",
        "VIRGL_APIR_BACKEND_LIBRARY": str(host.backend_library),
        "APIR_LLAMA_CPP_GGML_LIBRARY_PATH": str(host.ggml_library),
        "APIR_LLAMA_CPP_GGML_LIBRARY_REG": host.reg,
    }
    if host.reg == KNOWN_REGS["vulkan"]:
        # lavapipe (and other software Vulkan) is a CPU-type device that ggml-vulkan hides.
        env["GGML_VK_VISIBLE_DEVICES"] = "0"
    if log_dir is not None:
        env["VIRGL_APIR_LOG_TO_FILE"] = str(log_dir / "virgl-apir.log")
        env["APIR_LLAMA_CPP_LOG_TO_FILE"] = str(log_dir / "apir-ggml.log")
    return env


def guest_env(stack_env: dict[str, str]) -> dict[str, str]:
    """The guest's environment on this route: the stack's, never the APIR capset switch."""
    env = dict(stack_env)
    env.pop(APIR_CAPSET_ENV, None)
    return env
