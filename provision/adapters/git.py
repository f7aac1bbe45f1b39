"""git: read commits and trees from a local repository (a checkout or a bare mirror)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provision.core.errors import SourceUnavailable


def git_dir(src: Path) -> Path | None:
    if (src / ".git").exists():
        return src / ".git"
    if (src / "objects").is_dir() and (src / "HEAD").is_file():
        return src
    return None


def _git(gdir: Path, *args: str, stdout: int | None = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", f"--git-dir={gdir}", *args], stdout=stdout, stderr=subprocess.PIPE, check=False)


def has_commit(gdir: Path, rev: str) -> bool:
    return _git(gdir, "cat-file", "-e", f"{rev}^{{commit}}").returncode == 0


def archive(gdir: Path, rev: str, dest: Path) -> None:
    """Write the tree of ``rev`` into ``dest`` (as `git archive`, so as GitHub's tarballs)."""
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.Popen(["git", f"--git-dir={gdir}", "archive", "--format=tar", rev], stdout=subprocess.PIPE)
    tar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=arch.stdout, capture_output=True, check=False)
    if arch.stdout:
        arch.stdout.close()
    if arch.wait() != 0 or tar.returncode != 0:
        raise SourceUnavailable(f"git archive {rev} from {gdir} failed: {tar.stderr.decode(errors='replace').strip()}")


def commit_diff(gdir: Path, rev: str) -> bytes:
    """The change one commit makes, as a patch for `patch -p1`."""
    proc = _git(gdir, "diff", "--binary", f"{rev}^", rev)
    if proc.returncode != 0:
        raise SourceUnavailable(f"cannot read commit {rev} in {gdir}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout
