"""Version strings of podman, krunkit and libkrun, and the pairing rules in pins.json ``compat``.

Pure: parsers take the text a tool printed (or a path it lives at) and return a Version;
``pairing_problems`` compares three versions against the compat table. The doctor and
``provision launch`` both use it, so a skew is reported the same way everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Any

_NUM = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> Version:
        m = _NUM.search(text)
        if not m:
            raise ValueError(f"no version number in {text!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def series(self) -> str:
        return f"{self.major}.{self.minor}"


# `podman --version` prints "podman version 5.3.0"; a pkg build may add "-dev" or "-rc1".
_PODMAN = re.compile(r"^podman(?:\.exe)? version (\d+\.\d+\.\d+)\S*\s*$", re.MULTILINE)
# krunkit's clap parser (#[command(version)] in src/cmdline.rs) prints "krunkit 1.3.2".
_KRUNKIT = re.compile(r"^krunkit (\d+\.\d+\.\d+)\S*\s*$", re.MULTILINE)
# libkrun has no CLI: its version comes from the pkg-config file or the store/Cellar path.
_PC_VERSION = re.compile(r"^Version:\s*(\d+\.\d+\.\d+)\s*$", re.MULTILINE)
_LIBKRUN_PATH = re.compile(
    r"(?:/nix/store/[0-9a-z]{32}-libkrun(?:-efi|-gpu)?-|/Cellar/libkrun(?:-efi)?/)(\d+\.\d+\.\d+)"
)


def parse_podman(output: str) -> Version:
    m = _PODMAN.search(output)
    if not m:
        raise ValueError(f"not podman --version output: {output.strip()[:80]!r}")
    return Version.parse(m.group(1))


def parse_krunkit(output: str) -> Version:
    m = _KRUNKIT.search(output)
    if not m:
        raise ValueError(f"not krunkit --version output: {output.strip()[:80]!r}")
    return Version.parse(m.group(1))


def parse_libkrun_pc(text: str) -> Version:
    m = _PC_VERSION.search(text)
    if not m:
        raise ValueError("no 'Version:' line in libkrun.pc")
    return Version.parse(m.group(1))


def parse_libkrun_path(path: str) -> Version | None:
    """The version in a resolved library path (/nix/store/…-libkrun-1.19.3/…, …/Cellar/libkrun/1.19.6/…)."""
    m = _LIBKRUN_PATH.search(path)
    return Version.parse(m.group(1)) if m else None


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str


def pairing_problems(
    compat: dict[str, Any], *, podman: Version | None, krunkit: Version | None, libkrun: Version | None
) -> list[Problem]:
    """Every rule of the compat table that the given versions break (unknown versions are skipped)."""
    problems: list[Problem] = []
    if podman is not None:
        pmin = Version.parse(compat["podman_min"])
        if podman < pmin:
            problems.append(
                Problem(
                    f"podman {podman} is older than {pmin}: {compat.get('podman_min_why', 'no libkrun provider')}",
                    f"install podman >= {pmin}",
                )
            )
        if krunkit is not None:
            for rule in compat["podman_krunkit"]:
                if podman >= Version.parse(rule["podman_min"]) and krunkit < Version.parse(rule["krunkit_min"]):
                    problems.append(
                        Problem(
                            f"podman {podman} needs krunkit >= {rule['krunkit_min']}, found {krunkit}: {rule['why']}",
                            f"use the bundle's krunkit (>= {rule['krunkit_min']}) via CONTAINERS_HELPER_BINARY_DIR",
                        )
                    )
    if krunkit is not None and libkrun is not None:
        rows = [r for r in compat["krunkit_libkrun"] if r["krunkit"] == krunkit.series()]
        if not rows:
            known = ", ".join(r["krunkit"] for r in compat["krunkit_libkrun"])
            problems.append(
                Problem(
                    f"krunkit {krunkit} is not in the compat table (known series: {known})",
                    "use the pinned krunkit from the krun bundle",
                )
            )
        for r in rows:
            lo, hi = Version.parse(r["libkrun_min"]), Version.parse(r["libkrun_below"])
            if not (lo <= libkrun < hi):
                problems.append(
                    Problem(
                        f"krunkit {krunkit} needs libkrun >= {lo} and < {hi}, found {libkrun}: {r['why']}",
                        "install krunkit and libkrun as the pinned pair (nix profile add .#krun)",
                    )
                )
    return problems


def required_symbols(compat: dict[str, Any], krunkit: Version | None) -> list[tuple[str, str]]:
    """(symbol, why) pairs libkrun must export for this krunkit, plus the GPU entry point."""
    out = [(str(compat["libkrun_gpu_symbol"]), "virtio-gpu (Venus) needs it; without GPU=1 krunkit fails with ENOTSUP")]
    if krunkit is not None:
        for rule in compat.get("krunkit_symbols", []):
            if krunkit >= Version.parse(rule["krunkit_min"]):
                out.append((rule["symbol"], rule["why"]))
    return out
