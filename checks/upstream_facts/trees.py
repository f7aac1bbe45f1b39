"""Opening a pinned tree (a git clone or bare mirror) and reading files at its rev."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The pin of slp's fork is a GitLab archive of a krunkit tag (sources.virglrenderer-venus); its GitHub
# copy has only the venus-macos branch.
VENUS_REPO = "slp/virglrenderer"


class FactsError(Exception):
    pass


class Tree:
    def __init__(self, name: str, path: Path, rev: str) -> None:
        self.name, self.path, self.rev = name, path, rev

    def git(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["git", "-C", str(self.path), *args], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise FactsError(f"{self.name}: git {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def show_bytes(self, file: str) -> bytes | None:
        proc = subprocess.run(["git", "-C", str(self.path), "show", f"{self.rev}:{file}"], capture_output=True)
        return proc.stdout if proc.returncode == 0 else None

    def show(self, file: str) -> str | None:
        content = self.show_bytes(file)
        return content.decode("utf-8", "replace") if content is not None else None

    def files(self, under: str) -> list[str]:
        return sorted(self.git("ls-tree", "-r", "--name-only", self.rev, "--", under).split())

    def where(self, file: str, line: int, **extra: Any) -> dict[str, Any]:
        return {"tree": self.name, "rev": self.rev, "file": file, "line": line, **extra}


def resolve(path: Path, ref: str) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def open_tree(name: str, spec: str, pin: dict[str, Any]) -> tuple[Tree, dict[str, Any]]:
    path_text, _, asked = spec.partition("@")
    path = Path(path_text)
    source = f"{pin['owner']}/{pin['repo']}" if "owner" in pin else VENUS_REPO
    if not ((path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())):
        raise FactsError(f"--{name} {path_text}: not a git clone\nfix: pass a clone or mirror of {source}")
    pinned_ref = pin.get("rev") or (f"refs/tags/{pin['tag']}" if "tag" in pin else None)
    pinned = resolve(path, pinned_ref) if pinned_ref else None
    if pinned is not None:
        if asked and resolve(path, asked) != pinned:
            raise FactsError(
                f"--{name}: {asked} is not the pinned {pinned_ref}\nfix: drop @{asked}; the clone has the pin"
            )
        rev = pinned
    elif "rev" in pin:  # a rev pin names one tree exactly: nothing else may stand in for it
        raise FactsError(f"--{name}: the clone lacks the pinned rev {pin['rev']}\nfix: fetch that rev into it")
    elif asked:
        rev = resolve(path, asked) or ""
        if not rev:
            raise FactsError(f"--{name}: {asked} is not in the clone\nfix: name a tag, branch or commit it has")
    else:
        raise FactsError(
            f"--{name}: the clone lacks the pinned {pinned_ref or pin.get('url')}\n"
            f"fix: fetch it, or pass PATH@REV naming the nearest release to read instead"
        )
    info = {
        "source": source,
        "pinned": pin.get("rev") or pin.get("tag") or pin.get("version"),
        "read_rev": rev,
        "pin_in_clone": pinned is not None,
    }
    return Tree(name, path, rev), info
