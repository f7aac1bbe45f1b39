"""The route for this host, as a pure function: HostFacts (what the host saw: ``Host.route_facts``) in, a Decision
(stack, route, device, why) out, or a typed error.

Rules (issue 29): macOS → Venus through krunkit by default, APIR when its bundle is installed
and it was asked for, measured faster, or the machine runs APIR now. Linux → an NVIDIA GPU
with the CUDA host backend and the APIR host side means APIR; a render node means Venus with
egl-headless on that GPU; else Venus on lavapipe, with a warning that it is a CPU. A GPU asked
for that nothing on the host can give is E007 (GpuNotSupported): never a silent CPU run.
Stacks come from the catalog: the one for (host, route) is the stack that serves the route on
the fewest hosts (llama-apir-linux before llama-apir on Linux).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from provision.core.catalog import Stack
from provision.core.errors import GpuNotSupported, UnknownRoute

ROUTES = ("venus", "apir", "cpu")


@dataclass(frozen=True)
class RenderNode:
    path: str  # /dev/dri/renderD128
    driver: str | None  # the kernel driver behind it (amdgpu, i915, nvidia, virtio_gpu …)


@dataclass(frozen=True)
class HostFacts:
    platform: str  # "linux" or "darwin"
    render_nodes: tuple[RenderNode, ...] = ()
    nvidia_gpus: tuple[str, ...] = ()  # model names of NVIDIA GPUs the driver reports
    cuda_backend: str | None = None  # a cached ggml host build with libggml-cuda.so
    apir_host_tools: bool = False  # `provision host-tools --apir` was made
    vulkan_icds: tuple[str, ...] = ()  # ICD manifest names (lvp_icd.json …), host and host-tools chroot
    krun_bundle: str | None = None  # macOS: the bundle's krunkit
    apir_bundle: bool = False  # macOS: the bundle has libggml-virtgpu-backend and libggml-metal
    machine_route: str | None = None  # macOS: the route the podman machine was last started with
    apir_speedup: float | None = None  # tg of APIR over Venus, measured here by `provision bench`


@dataclass(frozen=True)
class Decision:
    stack: str
    route: str
    device: str  # what the guest's "GPU" really is
    why: str
    cpu: bool = False  # that device is a CPU (lavapipe): numbers are CPU numbers

    def line(self) -> str:
        warn = "; WARNING: lavapipe is a CPU, not a GPU" if self.cpu else ""
        return f"route: {self.stack} ({self.route}) on {self.device}: {self.why}{warn}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def stack_for(stacks: Mapping[str, Stack], platform: str, route: str) -> Stack | None:
    fit = [s for s in stacks.values() if s.route == route and platform in s.hosts]
    fit.sort(key=lambda s: (len(s.hosts), s.name))
    return fit[0] if fit else None


def is_lavapipe(icd: str) -> bool:
    return icd.startswith("lvp_icd")


def choose(
    facts: HostFacts, stacks: Mapping[str, Stack], *, gpu: bool, route: str | None = None
) -> Decision:
    """The stack and route for a guest on this host (``route`` narrows the choice)."""
    if route is not None and route not in ROUTES:
        raise UnknownRoute(f"route {route!r} is not one of {', '.join(ROUTES)}", fix="--route venus|apir|cpu")
    if route == "cpu" or (route is None and not gpu):
        return _decide(facts, stacks, "cpu", gpu, "guest CPU", "no --gpu: the CPU stack" if not gpu else "--route cpu")
    if facts.platform == "darwin":
        return _darwin(facts, stacks, gpu, route)
    if facts.platform == "linux":
        return _linux(facts, stacks, gpu, route)
    raise UnknownRoute(f"no route for platform {facts.platform!r}", fix="use macOS (Apple Silicon) or Linux")


def _decide(
    facts: HostFacts, stacks: Mapping[str, Stack], route: str, gpu: bool, device: str, why: str, *, cpu: bool = False
) -> Decision:
    stack = stack_for(stacks, facts.platform, route)
    if stack is None:
        raise UnknownRoute(
            f"no stack in the catalog serves route {route!r} on {facts.platform}",
            fix="provision/data/stacks.yaml: give a stack `route: " + route + "` and `hosts: [" + facts.platform + "]`",
        )
    if gpu and not stack.gpu:
        raise GpuNotSupported(
            f"--gpu with route {route!r}: stack {stack.name!r} has no GPU", fix="drop --gpu, or --route venus|apir"
        )
    return Decision(stack.name, route, device, why, cpu=cpu)


def _unreachable(what: str, fix: str) -> GpuNotSupported:
    return GpuNotSupported(f"a GPU was asked for and is not reachable: {what}", fix=fix)


# --- macOS ------------------------------------------------------------------------------------

_NO_BUNDLE_FIX = "install the krun bundle: nix profile add .#krun (then provision launch)"
_NO_APIR_FIX = "install the full krun bundle (.#krun has ggml-virtgpu-backend), or --route venus"


def _darwin(facts: HostFacts, stacks: Mapping[str, Stack], gpu: bool, route: str | None) -> Decision:
    if facts.krun_bundle is None:
        raise _unreachable("no krun bundle (krunkit with libkrun GPU=1) on this Mac", _NO_BUNDLE_FIX)
    metal = "the Mac's GPU (Metal)"
    if route == "apir":
        if not facts.apir_bundle:
            raise _unreachable("--route apir, but the krun bundle has no APIR host backend", _NO_APIR_FIX)
        return _decide(facts, stacks, "apir", gpu, f"{metal} via ggml-metal", "--route apir asked for")
    if route == "venus":
        return _decide(facts, stacks, "venus", gpu, f"{metal} via MoltenVK", "--route venus asked for")
    if facts.apir_bundle and facts.apir_speedup is not None and facts.apir_speedup > 1.0:
        why = f"measured faster here: APIR tg {facts.apir_speedup:.2f}x Venus (provision bench)"
        return _decide(facts, stacks, "apir", gpu, f"{metal} via ggml-metal", why)
    if facts.apir_bundle and facts.machine_route == "apir":
        why = "the podman machine runs APIR now (Venus is off on it until `provision launch --route venus`)"
        return _decide(facts, stacks, "apir", gpu, f"{metal} via ggml-metal", why)
    hint = "; the APIR bundle is installed: --route apir to use it" if facts.apir_bundle else ""
    return _decide(facts, stacks, "venus", gpu, f"{metal} via MoltenVK", "macOS default: Venus through krunkit" + hint)


# --- Linux ------------------------------------------------------------------------------------

_NO_VULKAN_FIX = (
    "install the GPU's Vulkan driver (a render node under /dev/dri), or run `provision host-tools` "
    "(its chroot ships lavapipe, a CPU Vulkan)"
)


def _linux(facts: HostFacts, stacks: Mapping[str, Stack], gpu: bool, route: str | None) -> Decision:
    nvidia = facts.nvidia_gpus[0] if facts.nvidia_gpus else None
    if route == "apir":
        if not facts.apir_host_tools:
            raise _unreachable(
                "--route apir, but the APIR host side (virglrenderer with APIR + host ggml) is not installed",
                "run `provision host-tools --apir`, or --route venus",
            )
        return _decide(facts, stacks, "apir", gpu, _apir_device(facts), "--route apir asked for")
    if route is None and nvidia and facts.cuda_backend and facts.apir_host_tools:
        why = f"NVIDIA GPU ({nvidia}) with the CUDA host backend ({facts.cuda_backend}): APIR forwards ggml to it"
        return _decide(facts, stacks, "apir", gpu, _apir_device(facts), why)
    asked = "--route venus asked for; " if route == "venus" else ""
    if facts.render_nodes:
        node = facts.render_nodes[0]
        driver = f" ({node.driver})" if node.driver else ""
        why = f"{asked}render node {node.path}{driver}: Venus with egl-headless on that GPU"
        return _decide(facts, stacks, "venus", gpu, f"{node.path}{driver}", why + _nvidia_note(facts))
    # Mesa ships every driver's ICD manifest (radeon, intel, nouveau …); without a render node
    # none of them has a device, so only lavapipe is left.
    if any(is_lavapipe(i) for i in facts.vulkan_icds):
        why = f"{asked}no render node and no GPU Vulkan driver: Venus on lavapipe"
        return _decide(facts, stacks, "venus", gpu, "lavapipe (CPU)", why + _nvidia_note(facts), cpu=True)
    raise _unreachable("no render node under /dev/dri and no Vulkan ICD (host or host-tools chroot)", _NO_VULKAN_FIX)


def _apir_device(facts: HostFacts) -> str:
    if facts.nvidia_gpus and facts.cuda_backend:
        return f"{facts.nvidia_gpus[0]} via the host ggml backend"
    return "the host ggml backend (host-tools --apir)"


def _nvidia_note(facts: HostFacts) -> str:
    if not facts.nvidia_gpus:
        return ""
    if not facts.cuda_backend:
        return f" (NVIDIA {facts.nvidia_gpus[0]} seen, no CUDA host backend: `provision ggml build cuda` for APIR)"
    return f" (NVIDIA {facts.nvidia_gpus[0]} and a CUDA backend seen; `provision host-tools --apir` for APIR)"
