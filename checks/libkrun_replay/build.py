"""The darwin APIR virglrenderer tree built for this host, and the replay harness linked to it.

The tree is the pinned MR 1590 tarball from ../shared/upstream, checked against its NAR hash,
with the Linux patches of the virglrenderer-apir pin (what this host's libc needs) and then,
unless ``series`` is off, the darwin series of the virglrenderer-apir-macos pin, each applied
with ``patch --fuzz=0``. It is built as Nix builds it (``buildtype=plain``: asserts on) and cached
under the project cache, keyed by the pins, the patches' bytes and the flags; the harness is linked
beside it under a name keyed by its own source, so a harness change relinks without a tree rebuild.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macho_link import trees

HERE = Path(__file__).resolve().parent
HARNESS = trees.REPO / "checks" / "libkrun-replay" / "replay.c"
# A Vulkan layer hiding the driver's external-memory fd extensions: lavapipe as MoltenVK looks to vkr.
LAYER = HARNESS.parent / "no-external-memory-layer.c"
LAYER_NAME = "VK_LAYER_KRUN_no_external_memory"
DARWIN_PIN = "virglrenderer-apir-macos"
LINUX_PIN = "virglrenderer-apir"
# The Nix recipe's tree options (checks/macho_link/trees.py DARWIN_TREES), asserts kept.
MESON_FLAGS = ("-Dvenus=true", "-Dapir=true", "-Dvulkan-dload=true", "--buildtype=plain", "-Db_ndebug=false")
# Bump when a change here changes what a build is.
BUILD_VERSION = 2


class ReplayError(Exception):
    pass


@dataclass(frozen=True)
class Variant:
    """series: our darwin series applied; host_pointer: blobs exported as the Apple handle type
    (what macOS builds do by default), to exercise that path on Linux."""

    series: bool = True
    host_pointer: bool = False

    @property
    def name(self) -> str:
        return ("patched" if self.series else "unpatched") + ("-host-pointer" if self.host_pointer else "")


@dataclass(frozen=True)
class Build:
    variant: Variant
    root: Path

    @property
    def harness(self) -> Path:
        return self.root / f"replay-{harness_key()}"

    @property
    def library_dir(self) -> Path:
        return self.root / "build" / "src"


def _patches(variant: Variant) -> list[str]:
    linux = list(trees.pin_of(LINUX_PIN).get("patches", []))
    return linux + (list(trees.pin_of(DARWIN_PIN).get("patches", [])) if variant.series else [])


def cache_key(variant: Variant) -> str:
    pin = trees.pin_of(DARWIN_PIN)
    h = hashlib.sha256(
        json.dumps(
            {
                "v": BUILD_VERSION,
                "variant": variant.__dict__,
                "rev": pin["rev"],
                "hash": pin["hash"],
                "patches": _patches(variant),
                "flags": MESON_FLAGS,
            },
            sort_keys=True,
        ).encode()
    )
    for rel in _patches(variant):
        h.update((trees.REPO / rel).read_bytes())
    return h.hexdigest()[:16]


def harness_key() -> str:
    return hashlib.sha256(HARNESS.read_bytes()).hexdigest()[:12]


def _run(cmd: list[str], cwd: Path, log: Path, what: str) -> None:
    with log.open("ab") as out:
        out.write(("$ " + " ".join(cmd) + "\n").encode())
        out.flush()
        try:
            proc = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        except FileNotFoundError:
            raise ReplayError(f"{what}: {cmd[0]} is not installed\nfix: scripts/setup-debian") from None
    if proc.returncode != 0:
        raise ReplayError(f"{what} failed (exit {proc.returncode}); see {log}\nfix: read the log's last lines")


def _meson() -> list[str]:
    """meson from this Python's environment (pyproject's test extra), else from PATH."""
    beside = Path(sys.executable).with_name("meson")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("meson")
    if not found:
        raise ReplayError("meson is not installed\nfix: scripts/setup-debian (pyproject.toml, extra `test`)")
    return [found]


def _build_into(root: Path, variant: Variant, upstream: Path, log: Path) -> None:
    pin = trees.pin_of(DARWIN_PIN)
    tree = trees.unpack(upstream / pin["upstream_tarball"], root, pin["hash"])
    tree.rename(root / "src")
    tree = root / "src"
    trees.apply_patches(tree, _patches(variant), log)
    flags = list(MESON_FLAGS)
    if variant.host_pointer:
        flags.append("-Dc_args=-DVIRGL_EXPORT_BLOB_HOST_POINTER=1")
    _run([*_meson(), "setup", str(root / "build"), *flags], tree, log, "meson setup")
    # every default target: the library, vtest's server and (on Linux) the render server
    _run(["ninja", "-C", str(root / "build"), "-j2"], tree, log, "ninja")


def _harness_command(root: Path, out: Path) -> list[str]:
    lib = root / "build" / "src"
    flags = [f"-I{root / 'src' / 'src'}", f"-I{lib}", f"-L{lib}", f"-Wl,-rpath,{lib}", "-lvirglrenderer", "-ldl"]
    return ["cc", "-std=gnu11", "-Wall", "-Werror", "-o", str(out), str(HARNESS), *flags]


def build(variant: Variant, cache: Path, upstream: Path = trees.UPSTREAM) -> Build:
    """The cached build of ``variant``, made once (in a scratch folder, then renamed into place)."""
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"{variant.name}-{cache_key(variant)}"
    made = Build(variant, root)
    if made.harness.is_file():
        return made
    sys.path.insert(0, str(trees.REPO))
    from provision.core import locks

    log = cache / f"{variant.name}.log"
    with locks.held(cache / f"{variant.name}.lock"):
        if made.harness.is_file():
            return made
        if not (root / "build").is_dir():
            work = Path(tempfile.mkdtemp(prefix=f"{root.name}.", suffix=".partial", dir=cache))
            log.write_text("")
            try:
                _build_into(work, variant, upstream, log)
                shutil.rmtree(root, ignore_errors=True)
                work.rename(root)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
        # linked where the library now lives (its rpath names that folder); written whole
        tmp = root / "replay.partial"
        _run(_harness_command(root, tmp), root, log, "the harness build")
        os.replace(tmp, made.harness)
    return made


def no_external_memory(cache: Path) -> dict[str, str]:
    """The environment that puts LAYER under every Vulkan instance (vkr's included), built once
    into the cache under a name keyed by its source."""
    key = hashlib.sha256(LAYER.read_bytes()).hexdigest()[:12]
    where = cache / f"layer-{key}"
    env = {"VK_LAYER_PATH": str(where), "VK_INSTANCE_LAYERS": LAYER_NAME}
    if where.is_dir():
        return env
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"{where.name}.", suffix=".partial", dir=cache))
    try:
        library = "libVkLayer_krun_no_external_memory.so"
        cmd = ["cc", "-std=gnu11", "-Wall", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden",
               "-o", str(work / library), str(LAYER)]  # fmt: skip
        _run(cmd, work, cache / "layer.log", "the Vulkan layer build")
        manifest = {
            "file_format_version": "1.1.0",
            "layer": {
                "name": LAYER_NAME,
                "type": "GLOBAL",
                "library_path": f"./{library}",
                "api_version": "1.3.0",
                "implementation_version": "1",
                "description": "hides VK_KHR_external_memory_fd and VK_EXT_external_memory_dma_buf",
            },
        }
        (work / "VkLayer_krun_no_external_memory.json").write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            work.rename(where)
        except OSError:
            if not where.is_dir():  # another run put it there first: keep theirs
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return env


def run(
    build_: Build,
    route: str,
    *,
    expect_handle: str | None = None,
    memory_handle: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> dict[str, Any]:
    """Run the harness; its calls (one JSON object each), its verdict and its stderr."""
    cmd = [str(build_.harness), route]
    if expect_handle:
        cmd += ["--expect-handle", expect_handle]
    if memory_handle:
        cmd += ["--expect-memory-handle", memory_handle]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRGL_", "APIR_"))}
    if route == "apir":
        full_env["VIRGL_ROUTE_VENUS_TO_APIR"] = "1"
    full_env.update(env or {})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    calls = []
    verdict: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "call" in obj:
            calls.append(obj)
        else:
            verdict = obj
    return {
        "route": route,
        "variant": build_.variant.name,
        "returncode": proc.returncode,
        "calls": calls,
        "ok": verdict.get("ok") is True and proc.returncode == 0,
        "stderr": proc.stderr[-4000:],
    }
