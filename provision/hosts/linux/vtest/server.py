"""The vtest server Venus-over-vtest needs: virglrenderer built with our patches (pins ``patches``).

Stock vtest (Debian's virgl-server 1.3.0, and every tree in reach) refuses a blob whose
export gives an opaque fd: lavapipe has no dma-buf export without udmabuf, and NVIDIA's
driver exports its device-local memory as opaque fds. The command then fails and Mesa's venus
client waits for an answer forever (seen on lavapipe here and on the lent H200, 2026-12-03).
`patches/virglrenderer/vtest-pass-opaque-blob-fd.patch` passes such fds on; the client maps
only what it asked to be mappable.

A vtest client maps a blob's fd at offset 0, which an opaque fd does not allow: lavapipe's
holds a private header before the memory (the client read other bytes than the GPU wrote,
and decoded `#` tokens), NVIDIA's cannot be mapped at all.
`patches/virglrenderer/venus-shm-backed-mappable-memory.patch` makes vkr back mappable
memory with shm it owns, imported by the driver as a host pointer (VK_EXT_external_memory_host),
and export it as an SHM blob, when the driver has no dma-buf export.

Built from pins ``virglrenderer-vtest`` (virglrenderer main of the 1.3.0 series, the
version sid's virgl-server packages; its NAR hash checked by apir/virglrenderer.py's
prepare_tree) with the pin's meson options (Venus on), in the host-tools chroot into
``/opt/virgl-vtest``, beside sid's own virglrenderer and without touching it. The MR 1590 tree
(1.2.0) was tried first: its Venus hid bf16 and cooperative matrices from ggml on the H200.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from provision.adapters import runner
from provision.adapters.chroot import Chroot
from provision.apir import virglrenderer as virgl_apir
from provision.core import layout, locks, paths
from provision.core import pins as pins_mod
from provision.core.errors import BuildFailed
from provision.hosts.linux.apir import host_side as apir_host
from provision.hosts.linux.tools import host_tools

PIN = "virglrenderer-vtest"
PREFIX = PurePosixPath("/opt/virgl-vtest")
STAMP = ".provision-virgl-vtest.json"
SRC, BUILD = "/src/virgl-vtest", "/build/virgl-vtest"
# Chroot paths of what the build installs, by the path sid's package has them at.
INSTALLED = {
    "usr/bin/virgl_test_server": f"{PREFIX.relative_to('/')}/bin/virgl_test_server",
    "usr/libexec/virgl_render_server": f"{PREFIX.relative_to('/')}/libexec/virgl_render_server",
}
LIB = f"{PREFIX.relative_to('/')}/lib"


def build_script(pin: pins_mod.SourcePin, jobs: int = 2) -> str:
    return "\n".join([
        "set -eu",
        f"rm -rf {BUILD}",
        f"cd {SRC}",
        " ".join(shlex.quote(a) for a in virgl_apir.meson_setup_args(BUILD, pin, PREFIX)),
        f"ninja -C {BUILD} -j{int(jobs)}",
        f"ninja -C {BUILD} install",
        *(f"test -x /{p}" for p in INSTALLED.values()),
    ])


def patches(pin: pins_mod.SourcePin) -> list[Path]:
    """The pin's patches (paths from the checkout's root, as pins.json lists them), in order."""
    return [layout.data_root() / rel for rel in pin.get("patches", [])]


def wanted(pins: pins_mod.Pins, pin: pins_mod.SourcePin) -> dict[str, object]:
    return {"virgl": pin["rev"], "fixes": [f.commit for f in virgl_apir.fixes(pin)],
            "patches": [hashlib.sha256(p.read_bytes()).hexdigest() for p in patches(pin)],
            "packages": apir_host.build_packages(pins)}


def built(root: Path, pins: pins_mod.Pins | None = None) -> bool:
    pins = pins or pins_mod.default()
    stamp = root / PREFIX.relative_to("/") / STAMP
    pin = pins.require(PIN, purpose="the vtest server")
    return stamp.is_file() and json.loads(stamp.read_text()) == wanted(pins, pin)


def make(tarball: Path, *, jobs: int = 2, log: Callable[[str], None] = print) -> Path:
    """The chroot root, with the patched vtest server in /opt/virgl-vtest (built once per pin and patch)."""
    pins = pins_mod.default()
    pin = pins.require(PIN, purpose="the vtest server")
    tree = virgl_apir.prepare_tree(tarball, pin)  # hash-checked, fixes applied; shared with the APIR build
    tools = host_tools.make(pins, log=log)
    want = wanted(pins, pin)
    with locks.held(str(tools.root) + ".apir.lock"):  # apt and /opt in the chroot: one writer at a time
        stamp = tools.root / PREFIX.relative_to("/") / STAMP
        if stamp.is_file() and json.loads(stamp.read_text()) == want:
            log(f"vtest server: cached in {tools.root}{PREFIX}")
            return tools.root
        src = paths.cache_dir("virgl-vtest") / "src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(tree, src, symlinks=True)
        for patch in patches(pin):
            runner.run(["patch", "-p1", "--forward", "--batch", "-d", str(src), "-i", str(patch)],
                       error=BuildFailed, what=f"{patch.name} on virglrenderer {pin['rev'][:12]}",
                       fix="refresh the patch against the pinned tree", missing_fix="install patch")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        ch = Chroot(tools.root)
        host_tools._run(ch.argv(["apt-get", "install", "-y", "-q", *apir_host.build_packages(pins)], env), log)
        build = paths.cache_dir("virgl-vtest") / "build"
        build.mkdir(parents=True, exist_ok=True)
        log("vtest server: building virglrenderer with the vtest patch in the chroot")
        host_tools._run(Chroot(tools.root, {src: SRC, build: "/build"}).argv(
            ["sh", "-c", build_script(pin, jobs)], env), log)
        tmp = stamp.with_name(stamp.name + ".partial")
        tmp.write_text(json.dumps(want, indent=1, sort_keys=True))
        tmp.replace(stamp)
    return tools.root
