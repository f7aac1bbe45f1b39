"""The APIR loopback outside the host-tools chroot: on a GPU host that has only a compiler and
the ggml it built (a host that is not Debian sid has no chroot to build in).

`loopback.build_script` takes where its inputs and outputs live (`loopback.Where`); here they
are the host's directories, so both runs compile exactly the same sources with the same flags
and patches; only where the files live differs. Also: the environment and argv of llama-bench
through the loopback, and the remoting ratio of two llama-bench JSON reports.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.core.errors import InvalidValue
from provision.hosts.linux.apir import loopback

# Paths are spliced into compiler flags (-I/dir, -Wl,-rpath,a:b), where quoting cannot reach
# them one by one: only plain characters are allowed.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/+-]*$")


@dataclass(frozen=True)
class HostDirs:
    tree: Path  # the pinned llama.cpp tree (a copy is fine)
    loopback_src: Path  # checks/apir-loopback
    patches: Path  # patches/llama.cpp
    work: Path  # build output; bin/ holds the loopback programs
    drm_include: Path  # holds xf86drm.h, libdrm/ and drm/virtgpu_drm.h (with the syncobj fields)
    lib: Path  # the host ggml: libggml-base.so and the target's backend library

    @property
    def bin(self) -> Path:
        return self.work / "bin"


def _checked(path: Path, what: str) -> str:
    text = str(path)
    if not _SAFE_PATH.match(text) or ".." in PurePosixPath(text).parts:
        raise InvalidValue(f"{what} {text!r} is not a plain absolute path (letters, digits, . _ / + - only)",
                           fix=f"pass a {what} without spaces or shell characters")
    return text


def where(dirs: HostDirs) -> loopback.Where:
    """The loopback build's directories on this host (checked: they also sit inside compiler flags)."""
    return loopback.Where(
        llama=_checked(dirs.tree, "llama.cpp tree"),
        loopback=_checked(dirs.loopback_src, "loopback source dir"),
        patches=_checked(dirs.patches, "patch dir"),
        work=_checked(dirs.work, "work dir"),
        lib=_checked(dirs.lib, "ggml library dir"),
        drm_include=_checked(dirs.drm_include, "drm include dir"),
    )


def build_script(dirs: HostDirs, patches: Sequence[str], target: str,
                 host_patches: Sequence[str] = loopback.HOST_PATCHES) -> str:
    """loopback.build_script on the host's directories: the same sources, flags and patches."""
    return loopback.build_script(patches, target, where(dirs), host_patches)


def run_env(dirs: HostDirs, target: str) -> dict[str, str]:
    """The backend library's environment (as the hypervisor sets it), on the host's paths."""
    return loopback.run_env(target, where(dirs))


def bench_env(dirs: HostDirs, target: str) -> dict[str, str]:
    """llama-bench through the loopback: its libllama and the loopback registry (libggml.so in
    bin/, found before the host's own registry in lib/, which would bring the native backend in)."""
    return {**run_env(dirs, target), "LD_LIBRARY_PATH": f"{dirs.bin}:{dirs.lib}"}


def ratios(native: Sequence[Mapping[str, object]], remote: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """Per llama-bench test (pp512, tg128, ...): tokens/s through APIR over tokens/s native."""
    def key(r: Mapping[str, object]) -> tuple[object, object]:
        return (r.get("n_prompt"), r.get("n_gen"))

    by_key = {key(r): r for r in native}
    rows: list[dict[str, object]] = []
    for r in remote:
        n = by_key.get(key(r))
        if n is None:
            continue
        nat, rem = float(str(n["avg_ts"])), float(str(r["avg_ts"]))
        test = f"pp{r['n_prompt']}" if r.get("n_prompt") else f"tg{r['n_gen']}"
        rows.append({"test": test, "native_ts": round(nat, 2), "native_sd": round(float(str(n.get("stddev_ts", 0))), 2),
                     "apir_ts": round(rem, 2), "apir_sd": round(float(str(r.get("stddev_ts", 0))), 2),
                     "ratio": round(rem / nat, 3) if nat else None})
    return rows
