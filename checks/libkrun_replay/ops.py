"""test-backend-ops on "[virtgpu] CPU" with the frontend's transport going through virglrenderer.

The APIR loopback (provision/hosts/linux/apir/loopback.py, on-host CPU target) built with
checks/libkrun-replay/virtgpu-virgl.cpp in place of its own transport: every command and every
shared page crosses a real APIR context of the replay's virglrenderer build, made in process as
libkrun makes it (the Venus capset with VIRGL_ROUTE_VENUS_TO_APIR=1).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from libkrun_replay import build

TRANSPORT = build.HARNESS.parent / "virtgpu-virgl.cpp"
DEVICE = "[virtgpu] CPU"


def _provision() -> None:
    import sys

    sys.path.insert(0, str(build.trees.REPO))


def loopback(b: build.Build):  # type: ignore[no-untyped-def]  # provision's Loopback, imported late
    """The loopback built against ``b`` (cached beside it), ready to run ops."""
    _provision()
    from provision.apir import builds
    from provision.core import layout
    from provision.hosts.linux.apir import loopback as lb
    from provision.images import sources

    work = b.root / "ops"
    work.mkdir(exist_ok=True)
    where = lb.Where(
        llama=str(sources.llama_cpp_tree()),
        loopback=str(lb.loopback_dir()),
        patches=str(layout.patches_dir() / "llama.cpp"),
        work=str(work),
        lib=str(builds.ensure("host").bin_dir),
        drm_include=str(builds.drm_headers()),
    )
    env = {**lb.run_env("cpu", where), "VIRGL_ROUTE_VENUS_TO_APIR": "1"}
    loop = lb.Loopback(where, env, work)
    stamp = work / "built-from"
    key = build.cache_key(b.variant) + ":" + TRANSPORT.read_text()
    if not (work / "bin" / "test-backend-ops").exists() or not stamp.exists() or stamp.read_text() != key:
        lib = b.library_dir
        flags = [f"-I{b.root / 'src' / 'src'}", f"-I{lib}", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lvirglrenderer"]
        script = lb.build_script(lb.guest_patches(), "cpu", where, transport=str(TRANSPORT), transport_flags=flags)
        log = work / "build.log"
        with log.open("wb") as out:
            import subprocess

            proc = subprocess.run(loop.argv(["sh", "-c", script]), stdout=out, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise build.ReplayError(f"building the loopback on virglrenderer failed; see {log}\nfix: read its end")
        stamp.write_text(key)
    return loop


def run(b: build.Build, ops: Sequence[str] | None = None) -> dict[str, object]:
    """Each op of the llama list (or ``ops``) through virglrenderer, as provision's loopback runs them."""
    _provision()
    from provision.apir import ops as apir_ops
    from provision.hosts.linux.apir import loopback as lb

    loop = loopback(b)
    chosen = [apir_ops.by_name()[o] for o in ops] if ops else list(apir_ops.LLAMA_OPS)
    return lb.run_ops(loop, DEVICE, chosen)


def one(b: build.Build, args: Sequence[str]) -> tuple[int, str]:
    """test-backend-ops with ``args``, its exit status and output."""
    loop = loopback(b)
    rc, out = loop.test_backend_ops(list(args))
    return int(rc), str(out)


def work_dir(b: build.Build) -> Path:
    return b.root / "ops"
