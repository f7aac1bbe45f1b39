"""Venus without a VM: virglrenderer's vtest server and Mesa's venus driver over its socket.

`virgl_test_server --venus` (Debian's virgl-server, the host-tools chroot's) listens on a unix
socket and hands each client a Venus context in virglrenderer's render server, which runs the
host's Vulkan driver. A client process loads Mesa's venus ICD with ``VN_DEBUG=vtest``: its
Vulkan calls then travel over that socket and the shared rings instead of virtio-gpu, so the
Venus route's own cost (serialisation, ring, render server) is seen without QEMU or a guest
CPU. The same llama.cpp build then runs once on the host driver (native) and once through
Venus, each process seeing exactly one Vulkan driver (``VK_DRIVER_FILES``).

Where the programs come from:
- the host-tools chroot (``Place.chroot``): here and in CI, lavapipe behind;
- a staged tree (``stage``): the same sid programs with their library closure and loader, for
  a host without sid (the lent H200, NVIDIA's driver behind), started through wrappers as the
  host-tools bundle starts QEMU.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from provision.adapters.chroot import Chroot
from provision.core.errors import GpuNotSupported, HostToolsMissing
from provision.hosts.linux.tools import bundle
from provision.hosts.linux.vtest import server as vtest_server

SERVER = "usr/bin/virgl_test_server"
RENDER_SERVER = "usr/libexec/virgl_render_server"
LLAMA_BENCH = "usr/bin/llama-bench"
COMPLETION = "usr/bin/llama-completion"
PROGRAMS = (SERVER, RENDER_SERVER, LLAMA_BENCH, COMPLETION)
BACKENDS = f"{bundle.LIB}/ggml/backends0"
VENUS_LIB = "libvulkan_virtio.so"
# Mesa's manifests in the chroot; a staged tree writes its own (relative) venus manifest apart
# from usr/share/vulkan/icd.d, which the bundle's wrappers add to every program's search.
CHROOT_ICDS = {"venus": "/usr/share/vulkan/icd.d/virtio_icd.json", "lavapipe": "/usr/share/vulkan/icd.d/lvp_icd.json"}
TREE_VENUS_ICD = "usr/share/krun-gpu/icd.d/virtio_icd.json"
# What NVIDIA's Vulkan ICD (inside libGLX_nvidia) loads from the client's side: glvnd and X
# client libraries (seen on the H200, checks/h200-routes/run).
DRIVER_COMPANIONS = tuple(p for p in bundle.DLOPENED if "/qemu/" not in p and "SDL" not in p)
STAGE_STAMP = "vtest-tree.json"
REBUILD = "rebuild the chroot: `provision host-tools --force` (virgl-server and llama.cpp-tools are pinned)"
SOCKET = "venus.sock"

# ggml-vulkan's line per device: "ggml_vulkan: 0 = NAME (DRIVER NAME) | uma: ...". The driver
# name is VkPhysicalDeviceDriverProperties::driverName: "venus" for Mesa's venus driver
# (DRIVER_ID_MESA_VENUS), "llvmpipe" for lavapipe, "NVIDIA" for NVIDIA's.
_DEVICE_LINE = re.compile(r"^ggml_vulkan: (\d+) = (.*) \(([^()]*)\) \| uma", re.M)


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    driver: str


def devices(stderr: str) -> list[Device]:
    """The Vulkan devices a llama.cpp process listed at start (its stderr)."""
    seen: dict[int, Device] = {}
    for m in _DEVICE_LINE.finditer(stderr):
        seen.setdefault(int(m.group(1)), Device(int(m.group(1)), m.group(2).strip(), m.group(3).strip()))
    return [seen[k] for k in sorted(seen)]


# llama-completion (its log at -v) names the device it loads onto, without the driver.
_USING = re.compile(r"using device (Vulkan\d+) \((.*)\) \([^()]*\) - ", re.M)


def used(stderr: str) -> list[Device]:
    seen = {int(m.group(1)[6:]): Device(int(m.group(1)[6:]), m.group(2), "") for m in _USING.finditer(stderr)}
    return [seen[k] for k in sorted(seen)]


# Per target: the native device's driver name and a word its device name holds.
TARGETS = {"lavapipe": ("llvmpipe", "llvmpipe"), "nvidia": ("NVIDIA", "NVIDIA")}


def expect(stderr: str, target: str, via_venus: bool) -> Device:
    """The one Vulkan device of a run, checked to be what was asked for: Mesa's venus driver on
    the target's device through Venus, the target's own driver natively. A process that saw
    another driver or none (ggml then runs on the CPU) is E007, not a number."""
    found = devices(stderr) or used(stderr)
    where = "through Venus" if via_venus else "natively"
    if len(found) != 1:
        raise GpuNotSupported(
            f"{where}: expected one Vulkan device, the process listed {len(found)}: {found}",
            fix="check VK_DRIVER_FILES and the vtest server's log; no CPU fallback is measured",
        )
    return check(found[0], target, via_venus)


def check(dev: Device, target: str, via_venus: bool) -> Device:
    """``dev`` is what a run asked for (``expect``; the fence probe names its own device), else E007."""
    driver, word = TARGETS[target]
    where = "through Venus" if via_venus else "natively"
    # A name alone (llama-completion's) is checked by name; llama-bench's line gives the driver too.
    ok = (dev.driver in ("venus", "") and dev.name.startswith("Virtio-GPU Venus (") and word in dev.name) \
        if via_venus else (dev.driver in (driver, "") and word in dev.name and "Venus" not in dev.name)
    if not ok:
        raise GpuNotSupported(
            f"{where}: the device is {dev.name!r} (driver {dev.driver!r}), not {target}"
            + (" behind Mesa's venus driver" if via_venus else "'s own driver"),
            fix="name the host's ICD with --native-icd; read the vtest server's log for the render server's driver",
        )
    return dev


@dataclass(frozen=True)
class Place:
    """Where the sid programs run: inside the host-tools chroot, or from a staged tree (``stage``)
    through its wrappers. ``work`` holds the socket and logs; ``model_dir`` the model."""

    root: Path
    chroot: bool
    work: Path
    model_dir: Path
    native_icd: str  # the host driver's manifest, as the programs see it
    base_env: Mapping[str, str] = field(default_factory=dict)  # a tree's programs: the caller's environment

    def path(self, host_path: Path) -> str:
        if not self.chroot:
            return str(host_path)
        for src, dst in ((self.work, "/vtest"), (self.model_dir, "/models")):
            if host_path.is_relative_to(src):
                return str(PurePosixPath(dst) / host_path.relative_to(src))
        raise ValueError(f"{host_path} is outside {self.work} and {self.model_dir}")

    @property
    def socket(self) -> str:
        return self.path(self.work / SOCKET)

    @property
    def venus_icd(self) -> str:
        return CHROOT_ICDS["venus"] if self.chroot else str(self.root / TREE_VENUS_ICD)

    def command(self, program: str, args: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """(argv, environment) that start ``program`` (a tree path such as ``LLAMA_BENCH``) here; in the
        chroot the vtest server is our patched build (vtest/server.py), with its own library."""
        if self.chroot:
            ch = Chroot(self.root, {self.work: "/vtest", self.model_dir: "/models"})
            real = vtest_server.INSTALLED.get(program, program)
            if program in vtest_server.INSTALLED:
                env = {**env, "LD_LIBRARY_PATH": "/" + vtest_server.LIB}
            return ch.argv(["/" + real, *args], env), {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        return [str(self.root / program), *args], {**self.base_env, **env}

    def cwd(self) -> Path:
        # ggml looks for its backends beside the executable: in a tree that is the carried loader's
        # directory, where stage() put them; the working directory is searched too.
        return self.work if self.chroot else self.root / bundle.LIB


def server_env(place: Place) -> dict[str, str]:
    """The vtest server's environment: the render server it starts sees the host driver alone."""
    # VTEST_COUNT_COMMANDS: each client's commands, by name, in the log when it leaves (our patch
    # vtest-count-commands.patch; bench/venus_vtest.py --commands reads them).
    env = {"VK_DRIVER_FILES": place.native_icd, "VTEST_COUNT_COMMANDS": "1"}
    env["RENDER_SERVER_EXEC_PATH"] = (
        "/" + vtest_server.INSTALLED[RENDER_SERVER] if place.chroot else str(place.root / RENDER_SERVER))
    return env


def server_args(place: Place) -> list[str]:
    # --no-virgl: no GL context (none is needed for Venus, and the H200 has no render node);
    # --multi-clients: one server for every client of the run, each its own context.
    return ["--venus", "--no-virgl", "--multi-clients", "--socket-path", place.socket]


def client_env(place: Place, via_venus: bool, vn_perf: str = "") -> dict[str, str]:
    """A llama.cpp process's Vulkan environment. ggml hides CPU-type devices (lavapipe, and Venus
    in front of it) unless named, so the one device is named in both cases."""
    env = {"GGML_VK_VISIBLE_DEVICES": "0"}
    if via_venus:
        env |= {"VK_DRIVER_FILES": place.venus_icd, "VN_DEBUG": "vtest", "VTEST_SOCKET_NAME": place.socket}
        if vn_perf:
            env["VN_PERF"] = vn_perf
    else:
        env["VK_DRIVER_FILES"] = place.native_icd
    return env


def chroot_place(root: Path, work: Path, model_dir: Path, target: str = "lavapipe") -> Place:
    missing = [p for p in (vtest_server.INSTALLED.get(p, p) for p in PROGRAMS) if not (root / p).exists()]
    if missing:
        raise HostToolsMissing(f"the host-tools chroot {root} lacks {', '.join(missing)}",
                               fix=REBUILD)
    if target != "lavapipe":
        raise GpuNotSupported(f"the host-tools chroot brings lavapipe only, not {target}",
                              fix="--target lavapipe here; --tree DIR (a staged tree) where the host has the driver")
    return Place(root, True, work, model_dir, CHROOT_ICDS["lavapipe"])


def tree_place(root: Path, work: Path, model_dir: Path, native_icd: str, base_env: Mapping[str, str]) -> Place:
    if not (root / STAGE_STAMP).is_file():
        raise HostToolsMissing(f"{root} is not a staged vtest tree (no {STAGE_STAMP})",
                               fix="make one with `bench/venus_vtest.py --stage DIR` where the host-tools chroot is")
    env = {k: v for k, v in base_env.items() if k not in ("LD_PRELOAD", "VK_DRIVER_FILES", "VK_ICD_FILENAMES")}
    return Place(root, False, work, model_dir, native_icd, env)


def stage(root: Path, out: Path, log: Callable[[str], None],
          extra: Mapping[str, Path] | None = None) -> dict[str, object]:
    """The vtest programs of the chroot at ``root`` with their libraries and loader, in ``out``
    (made whole: staged beside it, then renamed). No Mesa driver but venus: the host brings its own.
    ``extra``: programs built outside the chroot (tree path -> file), started the same way; their
    libraries must be among the chroot programs' (the fence probe needs libvulkan only)."""
    if out.exists():
        raise HostToolsMissing(f"{out} exists", fix="remove it or name another directory")
    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    backends = sorted(p.relative_to(root).as_posix() for p in (root / BACKENDS).glob("*.so"))
    companions = [p.relative_to(root).as_posix() for pat in DRIVER_COMPANIONS for p in sorted(root.glob(pat))]
    ours = f"{vtest_server.LIB}/libvirglrenderer.so.1"
    programs = {rel: vtest_server.INSTALLED.get(rel, rel) for rel in PROGRAMS}
    starts = [*programs.values(), ours, *backends, f"{bundle.LIB}/{VENUS_LIB}", *companions]
    libs = bundle.closure(root, starts)
    # The patched server's virglrenderer, not sid's (which the closure finds by its soname).
    found = bundle._resolve(root, ours)
    if found is None:
        raise HostToolsMissing(f"{ours} is missing in {root}", fix="build it: bench/venus_vtest.py does so first")
    libs["libvirglrenderer.so.1"] = found
    lib = tmp / bundle.LIB
    lib.mkdir(parents=True)
    loader = bundle._resolve(root, f"{bundle.LIB}/{bundle.LOADER}")
    if loader is None:
        raise HostToolsMissing(f"no {bundle.LOADER} in {root}", fix=REBUILD)
    shutil.copyfile(loader, lib / bundle.LOADER)
    (lib / bundle.LOADER).chmod(0o755)
    for name, path in sorted(libs.items()):
        shutil.copyfile(path, lib / name)
    for rel in [*backends, f"{bundle.LIB}/{VENUS_LIB}", *companions]:
        src = bundle._resolve(root, rel)
        if src is not None and not (lib / PurePosixPath(rel).name).exists():
            shutil.copyfile(src, lib / PurePosixPath(rel).name)
    sources: dict[str, Path] = {}
    for rel, built_at in programs.items():
        src = bundle._resolve(root, built_at)
        if src is None:
            raise HostToolsMissing(f"{rel} is missing in {root}", fix=REBUILD)
        sources[rel] = src
    for rel, src in (extra or {}).items():
        if rel in sources or not src.is_file():
            raise HostToolsMissing(f"cannot stage {src} as {rel}", fix="name a built file and a new tree path")
        sources[rel] = src
    for rel, src in sources.items():
        real = f"{bundle.REAL}/{PurePosixPath(rel).name}"
        (tmp / real).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, tmp / real)
        script = tmp / rel
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(bundle.wrapper(real, "render-server", len(PurePosixPath(rel).parts) - 1))
        script.chmod(0o755)
    icd = tmp / TREE_VENUS_ICD
    icd.parent.mkdir(parents=True)
    icd.write_text(bundle.icd_manifest(VENUS_LIB, len(PurePosixPath(TREE_VENUS_ICD).parts) - 1))
    size = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
    manifest: dict[str, object] = {"programs": list(sources), "libraries": len(libs), "backends": backends,
                                   "bytes": size}
    (tmp / STAGE_STAMP).write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.rename(out)
    log(f"vtest tree: {len(libs)} libraries, {size >> 20} MiB in {out}")
    return manifest
