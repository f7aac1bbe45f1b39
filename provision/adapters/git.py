"""git: read commits and trees from a local repository (a checkout or a bare mirror)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from provision.adapters import runner
from provision.core.errors import SourceUnavailable


def git_dir(src: Path) -> Path | None:
    if (src / ".git").exists():
        return src / ".git"
    if (src / "objects").is_dir() and (src / "HEAD").is_file():
        return src
    return None


def _git(gdir: Path, *args: str) -> runner.Done:
    return runner.run(["git", f"--git-dir={gdir}", *args], text=False, missing_fix="install git")


def has_commit(gdir: Path, rev: str) -> bool:
    return _git(gdir, "cat-file", "-e", f"{rev}^{{commit}}").status == 0


def archive(gdir: Path, rev: str, dest: Path) -> None:
    """Write the tree of ``rev`` into ``dest`` (as `git archive`, so as GitHub's tarballs)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".archive-") as tmp:
        tar = Path(tmp) / "tree.tar"
        made = _git(gdir, "archive", "--format=tar", f"--output={tar}", rev)
        out = runner.run(["tar", "-x", "-C", str(dest), "-f", str(tar)]) if made.ok else made
        if not out.ok:
            raise SourceUnavailable(f"git archive {rev} from {gdir} failed: {out.err.strip()}")


def commit_diff(gdir: Path, rev: str) -> bytes:
    """The change one commit makes, as a patch for `patch -p1`."""
    proc = _git(gdir, "diff", "--binary", f"{rev}^", rev)
    if proc.status != 0:
        raise SourceUnavailable(f"cannot read commit {rev} in {gdir}: {proc.err.strip()}")
    return proc.raw
