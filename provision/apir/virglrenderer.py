"""virglrenderer with APIR for the Linux host: the pinned tree, checked, plus the upstream
fixes sid needs, applied by commit id from the same repository (never vendored).

APIR is in no virglrenderer release and not in Debian; the pinned tree is the MR 1590
head. Where the network cannot reach it, ``--virgl-src`` names a local clone or mirror
(commits present, NAR hash of the pinned commit's tree equal), or a ``git archive`` of the
pinned commit: a ``.tar.xz`` or the folder it unpacks to (CI reads ``../shared/upstream/``).
An archive has no commits, so each fix comes from its patch file in ``patches/`` instead
(``applied_by_patch``, else ``archive_patch``); its NAR hash must equal the pin, else it is
refused. The prepared tree is cached under a key of the pin (rev, hash, fixes).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from provision.adapters import git, nix, runner
from provision.core import layout, paths
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


def is_archive(src: Path) -> bool:
    """A `git archive` of the pinned commit (a tarball, or its unpacked folder), not a repository."""
    return src.is_file() or (src.is_dir() and git.git_dir(src) is None)


def _unpack(src: Path, into: Path) -> None:
    """The archive's one top folder (or the folder given) as ``into``; links kept, nothing outside."""
    if src.is_dir():
        shutil.copytree(src, into, symlinks=True)
        return
    work = into.with_name(into.name + ".unpack")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        with tarfile.open(src) as tar:
            tar.extractall(work, filter="tar")  # refuses absolute and '..' names and links leaving work
    except (tarfile.TarError, OSError, EOFError) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise SourceUnavailable(f"--virgl-src {src}: not a readable tar archive ({exc})",
                                fix="give the virglrenderer-startergo-*.tar.xz of ../shared/upstream/") from None
    tops = list(work.iterdir())
    if len(tops) != 1 or not tops[0].is_dir():
        shutil.rmtree(work, ignore_errors=True)
        raise SourceUnavailable(f"--virgl-src {src}: a git archive unpacks to one folder, this one to {len(tops)}")
    tops[0].rename(into)
    shutil.rmtree(work, ignore_errors=True)


def _fix_diff(fix: Fix, pin: pins_mod.SourcePin, gdir: Path | None, src: Path) -> bytes:
    """The fix as a diff: its commit from the repository, or (from an archive) its patch file."""
    if gdir is not None:
        return git.commit_diff(gdir, fix.commit)
    entry = next(f for f in pin.get("linux_fixes", []) if f["commit"] == fix.commit)
    rel = entry.get("applied_by_patch") or entry.get("archive_patch")
    if not rel:
        raise SourceUnavailable(
            f"--virgl-src {src}: an archive has no commits, and fix {fix.commit[:8]} ({fix.why}) has no patch file",
            fix="give a git clone or mirror instead, or name the fix's patch in pins.json (archive_patch)",
        )
    return (layout.data_root() / rel).read_bytes()


def prepare_tree(src: Path, pin: pins_mod.SourcePin | None = None) -> Path:
    """The pinned tree with the fixes applied, cached by the pin (rev, hash, fixes); hash-checked first."""
    pin = pin or pins_mod.default().require(PIN, purpose="virglrenderer with APIR")
    gdir = None if is_archive(src) else verify_source(src, pin)
    pinned = hashlib.sha256(json.dumps([pin["rev"], pin["hash"], [f.commit for f in fixes(pin)]]).encode())
    key = pin["rev"][:12] + "-" + "-".join(f.commit[:8] for f in fixes(pin)) + "-" + pinned.hexdigest()[:8]
    dest = paths.cache_dir("virgl-apir") / f"src-{key}"
    if dest.exists():
        return dest
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    if gdir is not None:
        git.archive(gdir, pin["rev"], tmp)
    else:
        _unpack(src, tmp)
    got = nix.hash_path(tmp)
    if got != pin["hash"]:
        shutil.rmtree(tmp, ignore_errors=True)
        raise SourceUnavailable(
            f"--virgl-src {src}: the tree of {pin['rev']} hashes to {got}, the pin says {pin['hash']}",
            fix="the source does not hold the pinned content; use an unmodified clone or archive",
        )
    for fix in fixes(pin):
        patch = runner.run(
            ["patch", "-p1", "--forward", "--batch", "-d", str(tmp)],
            input=_fix_diff(fix, pin, gdir, src),
            text=False,
            missing_fix="install patch",
        )
        if patch.status != 0:
            raise SourceUnavailable(
                f"upstream fix {fix.commit[:8]} ({fix.why}) does not apply to {pin['rev'][:8]}: " + patch.out[-400:]
            )
    tmp.rename(dest)
    return dest
