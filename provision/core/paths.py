"""Where provision keeps its caches and state: one root each (settings ``cache``, ``state``),
and one table, ``LAYOUT``, of what lives under the cache root.

``cache_dir(NAME, ...)`` refuses a NAME that is not in the table, so a new sub-directory is
written down here first (and `provision config show --layout` lists them all).
"""

from __future__ import annotations

import os
from pathlib import Path

from provision.core import settings as settings_mod
from provision.core.errors import InvalidValue

CACHE_ENV = settings_mod.BY_KEY["cache"].env

# sub-directory of the cache root -> what lives there (who writes it)
LAYOUT: dict[str, str] = {
    "models": "the model store: refs/, blobs/, partial/, locks/ (provision/models/store.py)",
    "sources": "pinned source trees and sdists: llama.cpp, the kdrm headers (images/sources.py, apir/builds.py)",
    "rootfs": "sid root filesystems for image builds (images/build.py)",
    "contexts": "podman build contexts, one per stack and content key (images/build.py)",
    "builds": "what each running podman build has made, so the next build removes what a killed one left "
              "(adapters/podman.py)",
    "ggml": "cached ggml builds, one per variant and key (apir/builds.py)",
    "virgl-apir": "the virglrenderer-APIR mirror, sources and chroot build (apir/virglrenderer.py, hosts/linux/apir)",
    "virgl-vtest": "the patched vtest server's source copy and chroot build (hosts/linux/vtest/server.py)",
    "apir-loopback": "the APIR loopback's work directory in the host-tools chroot",
    "apir-loopback-host": "the APIR loopback's work directory on the host",
    "host-tools": "the sid chroots with QEMU + virglrenderer, one per pin key; bundle/ (hosts/linux/tools/)",
    "vm-disks": "guest root disks made from images, one per image id (images/disks.py)",
    "model-disks": "read-only model disks for guests (images/disks.py)",
    "gpu-slots": "flock files, one per GPU slot (hosts/linux/run/slots.py)",
    "runs": "one directory per guest run: logs, records of its processes (hosts/linux/run/run_dirs.py)",
    "jobs": "records of children that belong to no run (builds, host tools) (adapters/procs.py)",
    "serve": "what `provision serve` runs: NAME.json, NAME.log (serve/state.py)",
    "bench": "`provision bench` reports: JSON, Markdown, PNG (hosts/linux/run/bench.py)",
    "crash": "tracebacks of bugs, one file each (cli/__init__.py)",
    "apir-cuda": "checks/apir-cuda's work directory: the CUDA ggml build and the loopback (on a GPU host)",
    "apir-remoting": "bench/apir_remoting.py's two loopback builds (before/after the remoting cut), per target",
    "macho-link": "checks/macho-link's cross-builds for aarch64-macos, one per tree, its patches and zig",
    "libkrun-replay": "checks/libkrun-replay: the darwin APIR tree built here, with and without our series",
    "test-fixtures": "what the test suite builds once and reuses: the busybox base image, tool packages (tests/)",
}
# under the state root
STATE_LAYOUT: dict[str, str] = {
    "machines": "the route each podman machine was started with (hosts/darwin/machine_state.py)",
    "logs": "one log file per invocation, the newest kept (core/log.py)",
}


def _unusable(path: Path, why: str, key: str = "cache", settings: settings_mod.Settings | None = None) -> InvalidValue:
    s, env = settings or settings_mod.current(), settings_mod.BY_KEY[key].env
    source = s.source(key)
    shown = f"{env}={s.get(key)!r}" if source.startswith("environment") else source
    return InvalidValue(
        f"{key} directory {path} ({shown}) cannot be used: {why}",
        fix=f"set {env} to a writable directory (or `{key} = \"DIR\"` in the config file), or make {path} one",
    )


def _make_dir(path: Path, settings: settings_mod.Settings, key: str = "cache") -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise _unusable(path, "it exists and is not a directory", key, settings) from None
    except OSError as exc:
        raise _unusable(path, exc.strerror or str(exc), key, settings) from None
    if not path.is_dir():
        raise _unusable(path, "it is not a directory", key, settings)
    # access() reports a read-only filesystem (EROFS) even to root, before any write half-happens.
    if not os.access(path, os.W_OK | os.X_OK):
        raise _unusable(path, "it is not writable (read-only filesystem or permissions)", key, settings)
    return path


def cache_root(settings: settings_mod.Settings | None = None) -> Path:
    s = settings or settings_mod.current()
    return _make_dir(s.typed.cache, s)


def cache_dir(name: str, *parts: str, settings: settings_mod.Settings | None = None) -> Path:
    if name not in LAYOUT:
        raise AssertionError(f"cache sub-directory {name!r} is not in provision/core/paths.py LAYOUT")
    s = settings or settings_mod.current()
    return _make_dir(cache_root(s).joinpath(name, *parts), s)


def state_root(settings: settings_mod.Settings | None = None) -> Path:
    """Not made here: reading state must not create it (a missing state dir holds nothing)."""
    return (settings or settings_mod.current()).typed.state


def state_dir(name: str, settings: settings_mod.Settings | None = None) -> Path:
    if name not in STATE_LAYOUT:
        raise AssertionError(f"state sub-directory {name!r} is not in provision/core/paths.py STATE_LAYOUT")
    return state_root(settings) / name
