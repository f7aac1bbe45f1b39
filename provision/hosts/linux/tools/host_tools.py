"""Host tools for the Linux route: QEMU with Venus, virglrenderer + render server, glvnd's EGL.

Debian 12's QEMU (7.2) and virglrenderer (0.10) predate Venus-over-virtio-gpu-gl, so
``provision host-tools`` makes a Debian sid chroot holding the pinned packages
(pins.json ``debian.host_packages``) and provision runs QEMU inside it. The
chroot lives in the cache under a key of suite + package list + versions, is built in a
``.partial`` directory and renamed into place only when complete.

Where the tools come from, first match wins:
1. the setting ``host_tools`` (``PROVISION_HOST_TOOLS``: a chroot path, or ``/`` for the host's own programs);
2. the cached chroot for the current pins;
3. a bundle installed by ``provision host-tools --from`` (bundle.py: programs with their own
   loader and libc, run in place rather than in a chroot);
4. the host itself, if its QEMU has what the route needs.
``host_tools`` may also name a directory a bundle was installed into.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.adapters import debootstrap, partials, qemu, runner
from provision.adapters.chroot import Chroot
from provision.core import locks
from provision.core import pins as pins_mod
from provision.core import settings as settings_mod
from provision.core.diagnostics import Check
from provision.core.errors import HostToolsMissing, ToolMissing
from provision.core.log import say
from provision.core.paths import cache_dir
from provision.hosts.linux.tools import bundle_archive as bundle_mod
from provision.hosts.linux.tools import guest_user

ENV_VAR = settings_mod.BY_KEY["host_tools"].env
READY_STAMP = ".provision-host-tools.json"
# Programs looked up inside the tools tree (relative to its root).
RENDER_SERVER = "usr/libexec/virgl_render_server"
VIRGL_LIB_GLOB = "usr/lib/*/libvirglrenderer.so.1*"
# QEMU's SDL GL display loads it (SDL offscreen over EGL: run/display.py).
EGL_LOADER = "usr/lib/x86_64-linux-gnu/libEGL.so.1"
QEMU = "usr/bin/qemu-system-x86_64"


@dataclass(frozen=True)
class HostTools:
    """Where the tools are: ``root`` is ``/`` for the host's own, else a chroot or an installed bundle."""

    root: Path
    source: str  # "env" (the setting host_tools, from wherever it came), "cache", "bundle" or "host"
    bundle: bool = False  # programs under root start through their own wrappers, no chroot

    @property
    def is_chroot(self) -> bool:
        return not self.bundle and self.root.resolve() != Path("/")

    def chroot(self) -> Chroot:
        return Chroot(self.root)

    def path(self, rel: str) -> Path:
        return self.root / rel

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` as it runs against these tools (through chroot when they live in one)."""
        if self.bundle and "/" not in argv[0]:
            return [str(self.root / "usr/bin" / argv[0]), *argv[1:]]
        return self.chroot().argv(argv) if self.is_chroot else argv

    def as_dict(self) -> dict[str, object]:
        return {"root": str(self.root), "source": self.source, "chroot": self.is_chroot, "bundle": self.bundle}


def package_spec(pins: pins_mod.Pins | None = None) -> dict[str, str]:
    pins = pins or pins_mod.default()
    deb = pins.debian
    return dict(sorted(deb["host_packages"].items()))


def cache_key(pins: pins_mod.Pins | None = None) -> str:
    pins = pins or pins_mod.default()
    spec = {
        "suite": pins.debian["suite"],
        "packages": package_spec(pins),
        "apt_conf": [debootstrap.APT_SNAPSHOT_CONF, debootstrap.APT_NO_RECOMMENDS],
        "layout": 1,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def cached_root(pins: pins_mod.Pins | None = None) -> Path:
    return cache_dir("host-tools") / cache_key(pins)


def locate(
    pins: pins_mod.Pins | None = None,
    env: Mapping[str, str] | None = None,
    settings: settings_mod.Settings | None = None,
) -> HostTools | None:
    """The tools provision will use, or None when there are none at all.

    The one finder: `provision run` and `provision doctor` both ask it (``settings``: the
    command's, ``settings.current()`` by default; ``env``: whose PATH finds the host's QEMU).
    """
    env = os.environ if env is None else env
    named = (settings or settings_mod.current()).typed.host_tools
    if named:
        return HostTools(named, "env", bundle=bundle_mod.is_bundle(named))
    root = cached_root(pins)
    if (root / READY_STAMP).is_file():
        return HostTools(root, "cache")
    installed = bundle_mod.default_install_dir()
    if bundle_mod.is_bundle(installed):
        return HostTools(installed, "bundle", bundle=True)
    if runner.found("qemu-system-x86_64", path=env.get("PATH")):
        return HostTools(Path("/"), "host")
    return None


def find(tools: HostTools, rel: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Where one of the tools' files is: under their root, or for the host's own on PATH too."""
    found = sorted(tools.root.glob(rel)) if "*" in rel else [tools.path(rel)]
    if found and found[0].exists():
        return found[0]
    if tools.root.resolve() == Path("/") and rel.startswith("usr/bin/"):
        which = runner.found(Path(rel).name, path=(os.environ if env is None else env).get("PATH"))
        return Path(which) if which else None
    return None


def _files_check(tools: HostTools) -> list[Check]:
    checks = []
    for cid, rel, pkg in (
        ("host-tools.qemu", QEMU, "qemu-system-x86"),
        ("host-tools.render-server", RENDER_SERVER, "virgl-server"),
        ("host-tools.egl", EGL_LOADER, "libegl1"),
    ):
        p = tools.path(rel)
        if p.exists():
            checks.append(Check(cid, "ok", str(p)))
        else:
            checks.append(Check(cid, "fail", f"{p} not found (package {pkg})", fix=_fix(tools)))
    libs = sorted(tools.root.glob(VIRGL_LIB_GLOB))
    if libs:
        checks.append(Check("host-tools.virglrenderer", "ok", str(libs[0])))
    else:
        checks.append(
            Check(
                "host-tools.virglrenderer",
                "fail",
                f"no {VIRGL_LIB_GLOB} under {tools.root} (package libvirglrenderer1)",
                fix=_fix(tools),
            )
        )
    return checks


def _fix(tools: HostTools | None, settings: settings_mod.Settings | None = None) -> str:
    if tools is not None and tools.bundle:
        return "install the bundle again: `provision host-tools --from OUT.tar.zst`"
    if tools is not None and tools.source == "env":
        s = settings or settings_mod.current()
        return (f"point host_tools at a chroot made by `provision host-tools` (now {s.shown('host_tools')}), "
                f"or {s.unset_hint('host_tools')}")  # fmt: skip
    return "run `provision host-tools` (makes a Debian sid chroot with the pinned QEMU, virglrenderer and Mesa's EGL)"


def checks(tools: HostTools | None = None, *, probe: bool = True) -> list[Check]:
    """Doctor-style checks of the host tools; ``probe`` also asks QEMU what it supports."""
    tools = tools if tools is not None else locate()
    if tools is None:
        return [
            Check(
                "host-tools.location",
                "fail",
                f"no {ENV_VAR}, no cached chroot ({cached_root()}), no qemu-system-x86_64 on PATH",
                fix=_fix(None),
            )
        ]
    if not tools.root.is_dir():
        return [
            Check("host-tools.location", "fail", f"{tools.root} ({tools.source}) is not a directory", fix=_fix(tools))
        ]
    found = [Check("host-tools.location", "ok", f"{tools.root} ({tools.source})")]
    found += _files_check(tools)
    if probe and tools.path(QEMU).exists():
        try:
            caps = qemu.probe(tools.wrap, str(tools.root))
        except ToolMissing as exc:
            found.append(Check("host-tools.qemu-probe", "fail", exc.message, fix=_fix(tools)))
        else:
            found += qemu.capability_checks(caps, fix=_fix(tools))
    return found


def require(tools: HostTools | None = None, *, gpu: bool) -> HostTools:
    """The tools for a run, or E020 naming each missing piece and how to get it."""
    tools = tools if tools is not None else locate()
    if tools is not None and tools.is_chroot and tools.root.is_dir() and os.geteuid() != 0:
        raise HostToolsMissing(
            f"the host tools are in a chroot ({tools.root}); entering it needs root (mount namespace + chroot)",
            fix="run provision as root, or install QEMU >= 9.2 and virglrenderer >= 1.1 on the host "
            f"and set {ENV_VAR}=/",
        )
    found = checks(tools, probe=True)
    needed = [
        c
        for c in found
        if c.status == "fail" and (gpu or c.id in ("host-tools.location", "host-tools.qemu", "host-tools.qemu-probe"))
    ]
    if needed or tools is None:
        lines = "; ".join(f"{c.id}: {c.evidence}" for c in needed)
        raise HostToolsMissing(
            f"host tools for the Linux route are missing: {lines}", fix=needed[0].fix if needed else _fix(None)
        )
    return tools


# --- making the chroot -------------------------------------------------------------------


def _run(argv: list[str], log: Callable[[str], None], **kw: Any) -> None:
    """Run one step, streaming its output to ``log`` (long builds show progress)."""
    log("+ " + " ".join(argv[-12:]) if len(argv) > 12 else "+ " + " ".join(argv))
    done = runner.run(argv, name="host-tools", on_line=log, **kw)
    if done.status != 0:
        raise HostToolsMissing(
            f"making the host-tools chroot failed: `{' '.join(argv[-6:])}` exited {done.status}:\n"
            + "\n".join(done.tail),
            fix="check network access to Debian's package mirror, then rerun `provision host-tools`",
        )


def make(
    pins: pins_mod.Pins | None = None, *, log: Callable[[str], None] | None = None, force: bool = False
) -> HostTools:
    """Build (or reuse) the cached sid chroot with the pinned host packages."""
    pins = pins or pins_mod.default()
    log = log or say("host-tools")
    if os.geteuid() != 0:
        raise HostToolsMissing(
            "making the host-tools chroot needs root (debootstrap, chroot)", fix="run `sudo provision host-tools`"
        )
    final = cached_root(pins)
    # A tree being built; one left by a killed `host-tools` is never used (no stamp) and removed here.
    partial = final.with_name(final.name + ".building")
    if (final / READY_STAMP).is_file() and not force and not _leftovers(final):
        log(f"host tools: cached at {final}")
        return HostTools(final, "cache")
    with locks.held(str(final) + ".lock"):
        for leftover in _leftovers(final):
            log(f"host tools: removing {leftover}, left by a host-tools that did not finish")
            partials.remove(leftover)
        if (final / READY_STAMP).is_file() and not force:
            return HostTools(final, "cache")
        suite = pins.debian["suite"]
        log(f"host tools: debootstrap {suite} -> {partial}")
        debootstrap.make_rootfs(suite, partial)
        spec = package_spec(pins)
        ch = Chroot(partial)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        _run(ch.argv(["apt-get", "update", "-q"], env), log)
        wanted = [f"{name}={version}" for name, version in spec.items()]
        _run(ch.argv(["apt-get", "install", "-y", "-q", *wanted], env), log)
        _run(ch.argv(["apt-get", "clean"], env), log)
        # QEMU and the render server drop to this user (guest_user.py); runs add it to older trees.
        guest_user.ensure_user(partial)
        (partial / READY_STAMP).write_text(
            json.dumps({"suite": suite, "packages": spec, "key": cache_key(pins)}, indent=2)
        )
        if final.exists():
            # Out of the way by rename first: a kill during the removal leaves a leftover, not a stampless final.
            old = final.with_name(final.name + ".old")
            final.rename(old)
            partial.rename(final)
            partials.remove(old)
        else:
            partial.rename(final)
    log(f"host tools: ready at {final}")
    return HostTools(final, "cache")


def _leftovers(final: Path) -> list[Path]:
    """Half-made trees beside ``final`` (the stampless final itself included)."""
    found = [final.with_name(final.name + s) for s in (".building", ".building.partial", ".old")]
    if final.exists() and not (final / READY_STAMP).is_file():
        found.append(final)
    return [p for p in found if p.exists()]
