"""Checking the Fedora and COPR pins (pins.json ``fedora``) against the repositories.

``checks/fedora-pins`` runs ``dnf repoquery`` where there is network (in a container of the
pinned Fedora image, or on a Fedora host) and hands its output here. Everything below is
pure but ``write_pins``, which replaces pins.json atomically (temp file + rename).

A pin holds when the pinned image reports the pinned release and every pinned NEVR is among
the packages repoquery lists from the COPR; then the section's status becomes VERIFIED and its
``verification`` names the date, where it ran and the NEVRAs found.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.core.errors import InvalidValue

# The NEVR pins checked, by their key in pins.json's fedora section.
NEVR_KEYS = ("mesa_vulkan_drivers", "mesa_filesystem")
# repoquery's default line: name-[epoch:]version-release.arch
_NEVRA = re.compile(r"^(?P<name>\S+)-(?:(?P<epoch>\d+):)?(?P<version>[^-\s]+)-(?P<release>[^-\s]+)\.(?P<arch>[^.\s]+)$")
_IMAGE = re.compile(r"^fedora:(?P<release>\d+)$")
_DIST = re.compile(r"\.fc(?P<release>\d+)$")
# Marks the start of each part of the script's output, so one capture holds all of it.
OS_RELEASE_MARK = "=== os-release"
REPOQUERY_MARK = "=== repoquery"


@dataclass(frozen=True)
class Finding:
    key: str
    pinned: str
    ok: bool
    evidence: str


def release_of(fedora: dict[str, Any]) -> str:
    m = _IMAGE.match(str(fedora.get("image")))
    if not m:
        raise InvalidValue(f"fedora.image = {fedora.get('image')!r}: expected fedora:<release>")
    return m.group("release")


def nevrs(fedora: dict[str, Any]) -> dict[str, str]:
    """The pinned NEVRs; each must be a plain NEVR of the image's release (``.fcNN``)."""
    release = release_of(fedora)
    out = {}
    for key in NEVR_KEYS:
        value = str(fedora.get(key))
        dist = _DIST.search(value)
        if not re.fullmatch(r"[A-Za-z0-9._+-]+", value) or not dist:
            raise InvalidValue(f"fedora.{key} = {value!r}: expected name-version-release.fcNN")
        if dist.group("release") != release:
            raise InvalidValue(f"fedora.{key} = {value!r}: built for fc{dist.group('release')}, the image is "
                               f"{fedora['image']}")
        out[key] = value
    return out


def script(fedora: dict[str, Any]) -> str:
    """The shell the check runs in the pinned image (or on a Fedora host): the release, then the
    COPR's packages of the pinned names, one NEVRA a line."""
    names = sorted({nevr.rsplit("-", 2)[0] for nevr in nevrs(fedora).values()})
    return " && ".join([
        f"echo '{OS_RELEASE_MARK}'",
        "cat /etc/os-release",
        "dnf install -y -q --setopt=install_weak_deps=False dnf5-plugins >/dev/null",
        f"dnf copr enable -y {fedora['copr']} >/dev/null",
        f"echo '{REPOQUERY_MARK}'",
        # Only the COPR's repository (enabled above under the id copr:<host>:<owner>:<project>).
        f"dnf repoquery -q --repo='copr:*' {' '.join(names)}",
    ])


def parse(output: str) -> tuple[str | None, set[str]]:
    """(VERSION_ID from os-release, the NEVRAs repoquery listed, epoch 0 dropped)."""
    version_id = None
    found: set[str] = set()
    section = None
    for raw in output.splitlines():
        line = raw.strip()
        if line in (OS_RELEASE_MARK, REPOQUERY_MARK):
            section = line
            continue
        if section == OS_RELEASE_MARK and line.startswith("VERSION_ID="):
            version_id = line.split("=", 1)[1].strip('"')
        elif section == REPOQUERY_MARK:
            m = _NEVRA.match(line)
            if m and m.group("epoch") in (None, "0"):
                found.add(f"{m['name']}-{m['version']}-{m['release']}.{m['arch']}")
            elif m:
                found.add(f"{m['name']}-{m['epoch']}:{m['version']}-{m['release']}.{m['arch']}")
    return version_id, found


def check(fedora: dict[str, Any], output: str) -> list[Finding]:
    version_id, found = parse(output)
    release = release_of(fedora)
    findings = [Finding("image", str(fedora["image"]), version_id == release,
                        f"os-release VERSION_ID={version_id}" if version_id else "no os-release in the output")]
    for key, nevr in nevrs(fedora).items():
        arches = sorted(n for n in found if n.startswith(nevr + "."))
        evidence = ", ".join(arches) if arches else f"not among the {len(found)} NEVRAs the COPR lists"
        findings.append(Finding(key, nevr, bool(arches), evidence))
    return findings


def verified(raw: dict[str, Any], findings: list[Finding], *, when: str, where: str) -> dict[str, Any]:
    """pins.json data with the fedora section VERIFIED; refuses when any finding failed."""
    failed = [f for f in findings if not f.ok]
    if failed:
        raise InvalidValue("fedora pins do not hold: " + "; ".join(f"{f.key} {f.pinned}: {f.evidence}" for f in failed))
    data = json.loads(json.dumps(raw))
    fedora = data["fedora"]
    fedora["status"] = "VERIFIED"
    # provenance keeps where the values were read; this says how they were checked.
    fedora["verification"] = (
        f"checks/fedora-pins, {when}, {where}: {fedora['image']} reports VERSION_ID={release_of(fedora)}; "
        "dnf repoquery of the COPR lists " + "; ".join(f.evidence for f in findings if f.key != "image")
    )
    return data


def write_pins(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` whole or not at all."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
