"""apt-get, pointed at one other Debian suite without touching the system's apt state.

Used for build-only files the host's release is too old for (a newer kernel UAPI header).
The mirror is the one the system already uses (read from its sources), so the project
never names a mirror. apt checks the suite's signed Release file and the package hash;
the caller checks the pinned sha256 on top.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from provision.adapters import runner
from provision.core.errors import SourceUnavailable, ToolMissing

SOURCES_DIRS = (Path("/etc/apt/sources.list.d"), Path("/etc/apt"))
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")


def system_debian_mirror(roots: tuple[Path, ...] = SOURCES_DIRS) -> str:
    """The first main-archive URI of the system's apt sources (deb822 or one-line style)."""
    for root in roots:
        for path in sorted(root.glob("*.sources")) + sorted(root.glob("*.list")):
            for line in path.read_text(errors="replace").splitlines():
                line = line.strip()
                uris: list[str] = []
                if line.startswith("URIs:"):
                    uris = line.split()[1:]
                elif line.startswith("deb "):
                    uris = [w for w in line.split()[1:] if "://" in w][:1]
                for uri in uris:
                    if re.search(r"/debian/?$", uri):
                        return uri.rstrip("/")
    raise SourceUnavailable(
        f"no Debian main archive URI found in {', '.join(str(r) for r in roots)}",
        fix="configure apt with a Debian mirror (the build reads the URIs: line of the system's sources)",
    )


def _apt_options(root: Path) -> list[str]:
    return [
        "-o", "Dir::Etc::SourceList=/dev/null",
        "-o", f"Dir::Etc::SourceParts={root / 'sources'}",
        "-o", f"Dir::State::Lists={root / 'lists'}",
        "-o", f"Dir::Cache={root / 'cache'}",
        "-o", "Dir::State::status=/dev/null",
        "-o", "Acquire::Languages=none",
        "-o", "APT::Sandbox::User=root",
        "-o", "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false",
    ]


def download(package: str, version: str, *, suite: str, dest: Path, arch: str = "amd64") -> Path:
    """`apt-get download package=version` from `suite` into dest; returns the .deb path."""
    apt_get = runner.found("apt-get")
    if apt_get is None:
        raise ToolMissing("apt-get is not installed", fix="run on Debian or Ubuntu, or place the header by hand")
    mirror = system_debian_mirror()
    with tempfile.TemporaryDirectory(prefix="krun-apt-") as tmp:
        root = Path(tmp)
        for sub in ("sources", "lists/partial", "cache/archives/partial"):
            (root / sub).mkdir(parents=True)
        (root / "sources" / f"{suite}.sources").write_text(
            f"Types: deb\nURIs: {mirror}\nSuites: {suite}\nComponents: main\nArchitectures: {arch}\n"
            f"Signed-By: {KEYRING}\n"
        )
        opts = _apt_options(root) + ["-o", f"APT::Architecture={arch}"]
        for step, cmd, cwd in (
            ("apt-get update", [apt_get, *opts, "update"], None),
            ("apt-get download", [apt_get, *opts, "download", f"{package}={version}"], dest),
        ):
            proc = runner.run(cmd, cwd=cwd)
            if proc.status != 0:
                raise SourceUnavailable(
                    f"{step} {package}={version} from {suite} failed (exit {proc.status}): "
                    f"{(proc.err or proc.out).strip()[-600:]}",
                    fix=f"check that {suite} still carries {package} {version}; the pin is debian.build_packages",
                )
    found = sorted(dest.glob(f"{package}_*.deb"))
    if not found:
        raise SourceUnavailable(f"apt-get download {package}={version} left no .deb in {dest}")
    return found[-1]


def extract(deb: Path, dest: Path) -> None:
    """dpkg -x: unpack the data member (no maintainer scripts run)."""
    runner.run(["dpkg-deb", "-x", str(deb), str(dest)], error=SourceUnavailable, what=f"dpkg-deb -x {deb}")
