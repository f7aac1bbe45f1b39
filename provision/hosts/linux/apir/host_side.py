"""The APIR route's host side on Linux, made inside the host-tools chroot.

`provision host-tools --apir` builds, in the sid chroot that already runs QEMU:
- virglrenderer with APIR (pinned MR 1590 tree + the sid fixes) into /opt/virgl-apir;
- the host ggml from the pinned llama.cpp tree with our host-side fixes (ggml.HOST_PATCHES, on a
  copy): libggml-virtgpu-backend and the Vulkan
  backend (Debian 12's Vulkan headers are too old for it; sid's are not) into
  /opt/krun-gpu/ggml/lib.
Both are built against the chroot's own libraries, so QEMU there can load them. A stamp
file records what was built; `locate()` reads it back for `provision run --route apir`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters.chroot import Chroot
from provision.apir import builds as ggml_builds
from provision.apir import ggml as ggml_build
from provision.apir import route as apir_route
from provision.apir import virglrenderer as virgl_apir
from provision.core import layout, locks, paths, settings
from provision.core import pins as pins_mod
from provision.core.diagnostics import Check
from provision.core.errors import ApirBackendRefused, HostToolsMissing
from provision.core.log import say
from provision.hosts.linux.tools import host_tools
from provision.images import sources

STAMP = ".provision-apir.json"
GGML_PREFIX = PurePosixPath("/opt/krun-gpu/ggml")
VARIANT = "vulkan"
# Where the sources and build trees appear inside the chroot during the build.
SRC_VIRGL = "/src/virglrenderer"
SRC_LLAMA = "/src/llama.cpp"
SRC_OFFLINE = "/src/offline"
BUILD = "/build"


@dataclass(frozen=True)
class ApirHost:
    tools: host_tools.HostTools
    prefix: apir_route.VirglPrefix
    ggml: apir_route.HostGgml

    def qemu_env(self, log_dir: PurePosixPath | None = None) -> dict[str, str]:
        return apir_route.hypervisor_env(self.prefix, self.ggml, log_dir=log_dir)


def _ggml() -> apir_route.HostGgml:
    v = ggml_build.variant(VARIANT)
    lib = GGML_PREFIX / "lib"
    return apir_route.HostGgml(lib / "libggml-virtgpu-backend.so", lib / str(v.ggml_library), str(v.ggml_reg))


# A bundle's host brings its own ggml (built there, e.g. `provision ggml build --variant cuda`):
# the setting apir_host_ggml, the directory holding libggml-virtgpu-backend.so and one GPU backend library.
HOST_GGML_ENV = settings.BY_KEY["apir_host_ggml"].env


def _bundle_ggml(where: Path, given: settings.Settings | None = None) -> apir_route.HostGgml:
    lib = PurePosixPath(where)
    for name in ("cuda", "vulkan"):
        v = ggml_build.variant(name)
        if Path(str(lib / str(v.ggml_library))).is_file():
            return apir_route.HostGgml(lib / "libggml-virtgpu-backend.so", lib / str(v.ggml_library), str(v.ggml_reg))
    shown = (given or settings.current()).shown("apir_host_ggml")
    raise HostToolsMissing(
        f"{shown}: {where} holds neither libggml-cuda.so nor libggml-vulkan.so",
        fix=f"point {HOST_GGML_ENV} (or apir_host_ggml in the config file) at the bin/ of "
        "`provision ggml build --variant cuda` (or vulkan)",
    )


def own_ggml(given: settings.Settings | None = None) -> Path | None:
    """The setting apir_host_ggml: a bundle's host's own ggml build, or None."""
    return (given or settings.current()).typed.apir_host_ggml


def locate(tools: host_tools.HostTools | None = None) -> ApirHost | None:
    tools = tools if tools is not None else host_tools.locate()
    if tools is None:
        return None
    ggml_dir = own_ggml()
    if tools.bundle and ggml_dir:
        # A bundle made with --apir: its virglrenderer at the chroot's path under the bundle root.
        prefix = PurePosixPath(str(tools.root)) / str(virgl_apir.PREFIX).lstrip("/")
        if not Path(str(prefix / "lib" / "libvirglrenderer.so.1")).is_file():
            return None
        return ApirHost(tools, apir_route.VirglPrefix(prefix), _bundle_ggml(ggml_dir))
    if not (tools.root / STAMP).is_file():
        return None
    return ApirHost(tools, apir_route.VirglPrefix(virgl_apir.PREFIX), _ggml())


def require(tools: host_tools.HostTools | None = None) -> ApirHost:
    found = locate(tools)
    if found is None:
        raise HostToolsMissing(
            "the APIR route needs virglrenderer with APIR and the host ggml in the host-tools chroot",
            fix="run `provision host-tools --apir` (add --virgl-src DIR where the pinned tree cannot be fetched)",
        )
    return found


def checks(tools: host_tools.HostTools | None = None) -> list[Check]:
    found = locate(tools)
    if found is None:
        return [
            Check(
                "host-tools.apir",
                "fail",
                "no APIR build in the host-tools chroot",
                fix="run `provision host-tools --apir` (with --virgl-src DIR where the pinned tree cannot be fetched)",
            )
        ]
    out = []
    root = found.tools.root
    for cid, rel in (
        ("host-tools.apir.virglrenderer", found.prefix.lib / "libvirglrenderer.so.1"),
        ("host-tools.apir.render-server", found.prefix.render_server),
        ("host-tools.apir.backend", found.ggml.backend_library),
        ("host-tools.apir.ggml", found.ggml.ggml_library),
    ):
        path = Path(str(rel)) if found.tools.bundle else root / str(rel).lstrip("/")
        out.append(
            Check(cid, "ok", str(path))
            if path.exists()
            else Check(cid, "fail", f"{path} missing", fix="run `provision host-tools --apir` again")
        )
    return out


def build_packages(pins: pins_mod.Pins) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(pins.debian["host_apir_build_packages"].items())]


def build_script(pin: pins_mod.SourcePin, jobs: int = 2) -> str:
    """The shell run inside the chroot: virglrenderer, then ggml, each from a clean build dir."""
    v = ggml_build.variant(VARIANT)
    plan = ggml_build.plan(
        v,
        source=Path(SRC_LLAMA),
        build_dir=Path(f"{BUILD}/ggml"),
        key="chroot",
        offline_include=Path(f"{SRC_OFFLINE}/ggml-virtgpu-offline.cmake"),
        jobs=jobs,
    )
    meson = " ".join(virgl_apir.meson_setup_args(f"{BUILD}/virgl", pin))
    return "\n".join(
        [
            "set -eu",
            f"rm -rf {BUILD}/virgl {BUILD}/ggml",
            f"cd {SRC_VIRGL}",
            meson,
            f"ninja -C {BUILD}/virgl -j{jobs}",
            f"ninja -C {BUILD}/virgl install",
            " ".join(plan.configure),
            " ".join(plan.build),
            f"mkdir -p {GGML_PREFIX}/lib",
            # Versioned sonames and their links together (the backend asks for libggml-base.so.0);
            # RUNPATH is $ORIGIN, so the libraries find each other in this one directory.
            f"cp -a {BUILD}/ggml/bin/lib*.so* {GGML_PREFIX}/lib/",
            *(f"test -e {GGML_PREFIX}/lib/{a}" for a in v.artifacts if a.endswith(".so")),
        ]
    )


def make(
    virgl_src: Path | None,
    *,
    pins: pins_mod.Pins | None = None,
    log: Callable[[str], None] | None = None,
) -> ApirHost:
    pins = pins or pins_mod.default()
    log = log or say("apir")  # stderr: stdout is for --json
    pin = pins.require(virgl_apir.PIN, purpose="the APIR route's virglrenderer")
    # Fail on the source before spending minutes on anything else.
    src = virgl_src if virgl_src is not None else virgl_apir.fetch_pinned(pin)
    tree = virgl_apir.prepare_tree(src, pin)
    tools = host_tools.make(pins, log=log)
    host_patches = ggml_build.variant(VARIANT).patches
    source_id = str(pins.source(sources.SDIST_PIN)["sha256"])
    llama = ggml_builds.patched_tree(sources.llama_cpp_tree(pins), host_patches, source_id)  # ggml.HOST_PATCHES
    build_dir = paths.cache_dir("virgl-apir", "build")
    with locks.held(str(tools.root) + ".apir.lock"):
        stamp = tools.root / STAMP
        wanted = {
            "virgl": pin["rev"],
            "fixes": [f.commit for f in virgl_apir.fixes(pin)],
            "ggml": VARIANT,
            "llama_cpp": pins.source("llama-cpp")["rev"],
            "llama_cpp_patches": ggml_builds.patch_digest(host_patches),
            "packages": build_packages(pins),
        }
        if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
            log(f"apir host: cached in {tools.root}")
            return require(tools)
        ch = Chroot(tools.root)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        log("apir host: installing build packages in the host-tools chroot")
        host_tools._run(ch.argv(["apt-get", "update", "-q"], env), log)
        host_tools._run(ch.argv(["apt-get", "install", "-y", "-q", *build_packages(pins)], env), log)
        binds = {tree: SRC_VIRGL, llama: SRC_LLAMA, layout.patches_dir() / "cmake": SRC_OFFLINE, build_dir: BUILD}
        log("apir host: building virglrenderer (APIR) and ggml (Vulkan) in the chroot; this takes minutes")
        host_tools._run(
            Chroot(tools.root, binds).argv(["sh", "-c", build_script(pin, jobs=os.cpu_count() or 2)], env), log
        )
        stamp.write_text(json.dumps(wanted, indent=2, sort_keys=True))
    return require(tools)


def doctor_checks(ctx: object) -> list[Check]:
    """The Linux APIR route's checks for `provision doctor` (skipped until it is set up)."""
    tools = host_tools.locate()
    found = locate(tools)
    if found is None:
        return [
            Check(
                "linux.apir.route",
                "skip",
                "no APIR build in the host tools: the Linux APIR route is not set up",
                fix="run `provision host-tools --apir` to use `provision run llama-apir-linux --gpu`",
            )
        ]
    out = checks(tools)
    # Stock QEMU offers no APIR capset (10): the route rides on the Venus capset, re-routed.
    env = found.qemu_env()
    out.append(
        Check(
            "linux.apir.capset",
            "ok",
            "QEMU offers the Venus capset only; VIRGL_ROUTE_VENUS_TO_APIR=1 routes it to APIR and the guest "
            "does not set GGML_REMOTING_USE_APIR_CAPSET",
        )
    )
    try:
        apir_route.check_target(found.ggml)
        out.append(
            Check(
                "linux.apir.device-type",
                "ok",
                f"{env['APIR_LLAMA_CPP_GGML_LIBRARY_PATH']} ({env['APIR_LLAMA_CPP_GGML_LIBRARY_REG']}) "
                "gives a GPU-type remote device",
            )
        )
    except ApirBackendRefused as exc:
        out.append(Check("linux.apir.device-type", "fail", exc.message, fix=exc.fix))
    return out
