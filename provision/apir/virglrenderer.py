"""virglrenderer with APIR for the Linux host: the pinned tree, checked, plus the upstream
fixes sid needs, applied by commit id from the same repository (never vendored).

APIR is in no virglrenderer release and not in Debian; the pinned tree is the MR 1590
head. Where the network cannot reach it, ``--virgl-src`` names a local clone or mirror,
which is checked against the pin (commit present, NAR hash of its tree equal).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters import git, nix, runner
from provision.core import paths
from provision.core import pins as pins_mod
from provision.core.errors import SourceUnavailable

PIN = "virglrenderer-apir"
PREFIX = PurePosixPath("/opt/virgl-apir")


@dataclass(frozen=True)
class Fix:
    commit: str
    why: str


def fixes(pin: pins_mod.SourcePin) -> list[Fix]:
    return [Fix(f["commit"], f["why"]) for f in pin.get("linux_fixes", [])]


def meson_setup_args(build_dir: str, pin: pins_mod.SourcePin, prefix: PurePosixPath = PREFIX) -> list[str]:
    """Only options this tree declares: the MR head (1.2.0) has `venus` and `apir`, no `drm`."""
    opts = pin.get("meson_options", {})
    flags = [f"-D{k}={'true' if v else 'false'}" for k, v in sorted(opts.items())]
    return ["meson", "setup", build_dir, f"--prefix={prefix}", "--libdir=lib", "--buildtype=release", *flags]


def unreachable(pin: pins_mod.SourcePin) -> SourceUnavailable:
    return SourceUnavailable(
        f"the APIR virglrenderer tree {pin['owner']}/{pin['repo']} @ {pin['rev']} cannot be fetched from here",
        fix=f"pass --virgl-src DIR: a local clone or mirror of {pin['owner']}/{pin['repo']} that has commit "
        f"{pin['rev']} and the fixes {', '.join(f.commit[:8] for f in fixes(pin))}",
    )


def fetch_pinned(pin: pins_mod.SourcePin, *, timeout_s: float = 60.0) -> Path:
    """Fetch the pinned commits into a cached bare repository, or fail naming --virgl-src."""
    dest = paths.cache_dir("virgl-apir") / "mirror.git"
    if not (dest / "HEAD").exists():
        runner.run(["git", "init", "--quiet", "--bare", str(dest)], error=SourceUnavailable, what="git init",
                   fix=f"make {dest.parent} writable, or pass --virgl-src DIR", missing_fix="install git")  # fmt: skip
    url = f"https://github.com/{pin['owner']}/{pin['repo']}.git"
    for rev in [pin["rev"], *(f.commit for f in fixes(pin))]:
        if git.has_commit(dest, rev):
            continue
        proc = runner.run(
            ["git", f"--git-dir={dest}", "fetch", "--quiet", "--depth=2", url, rev],
            timeout=timeout_s,
            env={"GIT_TERMINAL_PROMPT": "0", "PATH": "/usr/bin:/bin"},
            missing_fix="install git",
        )
        if proc.timed_out:
            raise unreachable(pin)
        if proc.status != 0 or not git.has_commit(dest, rev):
            err = unreachable(pin)
            err.message += f" ({proc.err.strip().splitlines()[-1] if proc.err.strip() else 'fetch failed'})"
            raise err
    return dest


def verify_source(src: Path, pin: pins_mod.SourcePin) -> Path:
    """Check a local repository against the pin; returns its git dir."""
    gdir = git.git_dir(src)
    if gdir is None:
        raise SourceUnavailable(f"--virgl-src {src}: not a git repository (no .git, not a bare mirror)")
    for rev in [pin["rev"], *(f.commit for f in fixes(pin))]:
        if not git.has_commit(gdir, rev):
            raise SourceUnavailable(
                f"--virgl-src {src}: commit {rev} is missing",
                fix=f"use a clone of {pin['owner']}/{pin['repo']} with refs/merge-requests/1590/head fetched",
            )
    return gdir


def prepare_tree(src: Path, pin: pins_mod.SourcePin | None = None) -> Path:
    """The pinned tree with the fixes applied, cached by rev + fixes; hash-checked first."""
    pin = pin or pins_mod.default().require(PIN, purpose="virglrenderer with APIR")
    gdir = verify_source(src, pin)
    key = pin["rev"][:12] + "-" + "-".join(f.commit[:8] for f in fixes(pin))
    dest = paths.cache_dir("virgl-apir") / f"src-{key}"
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    git.archive(gdir, pin["rev"], tmp)
    got = nix.hash_path(tmp)
    if got != pin["hash"]:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceUnavailable(
            f"--virgl-src {src}: the tree of {pin['rev']} hashes to {got}, the pin says {pin['hash']}",
            fix="the repository does not hold the pinned content; use an unmodified clone",
        )
    for fix in fixes(pin):
        patch = runner.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(tmp)],
            input=git.commit_diff(gdir, fix.commit),
            text=False,
            missing_fix="install patch",
        )
        if patch.status != 0:
            raise SourceUnavailable(
                f"upstream fix {fix.commit[:8]} ({fix.why}) does not apply to {pin['rev'][:8]}: " + patch.out[-400:]
            )
    tmp.rename(dest)
    return dest
