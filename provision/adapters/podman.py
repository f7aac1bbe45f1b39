"""podman (through the owned runner): image builds, imports, inspection and rootfs export.

On hosts without a unified cgroup v2 hierarchy, or inside a container, podman's default
OCI runtime isolation cannot build here (cgroups in hybrid mode, setrlimit refused), so
builds use chroot isolation and the cgroupfs manager. The decision is data (BuildFlags)
so tests and --dry-run can show it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.adapters import partials, runner
from provision.core import paths
from provision.core.errors import ImageBuildFailed, ToolMissing
from provision.core.log import say

# Multi-stage builds prefix each line with the stage: "[1/2] STEP 7/7: RUN ...".
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP (\d+)/(\d+): (.*)$")
_CACHE_HIT = re.compile(r"^--> Using cache [0-9a-f]+")
# What names a build's buildah working containers: each stage's FROM image (its last path
# component, e.g. "debian-builder") and each layer it committed or reused ("--> 402697f6c84").
_FROM = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: FROM (\S+)", re.I)
_LAYER = re.compile(r"^--> (?:Using cache )?([0-9a-f]{8,64})\s*$")
_WORKING = re.compile(r"^(.+)-working-container(?:-\d+)?$")


@dataclass(frozen=True)
class HostFacts:
    cgroup_fs: str  # "cgroup2fs" when unified, "tmpfs" for v1/hybrid
    systemd_running: bool
    in_container: bool


@dataclass(frozen=True)
class BuildFlags:
    isolation: str | None
    cgroup_manager: str | None
    reasons: tuple[str, ...]

    def args(self) -> list[str]:
        out = []
        if self.isolation:
            out.append(f"--isolation={self.isolation}")
        if self.cgroup_manager:
            out.append(f"--cgroup-manager={self.cgroup_manager}")
        return out

    def offline(self) -> tuple[list[str], list[str]]:
        """(command prefix, build args) that take the network away from every RUN step.

        Chroot isolation refuses --network other than host (podman 4.3: "cannot set --network
        other than host with --isolation chroot") and runs steps in podman's own network
        namespace, so the whole build runs in a new, empty one (`unshare --net`, root only).
        --pull=never: a FROM that is not a local image fails instead of reaching a registry."""
        if self.isolation == "chroot":
            return ["unshare", "--net"], ["--pull=never"]
        return [], ["--network=none", "--pull=never"]


def probe_host() -> HostFacts:
    try:
        fs = runner.run(["stat", "-fc", "%T", "/sys/fs/cgroup"]).out.strip()
    except (OSError, ToolMissing):
        fs = "unknown"
    in_container = Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()
    return HostFacts(fs, Path("/run/systemd/system").is_dir(), in_container)


def decide_flags(facts: HostFacts, isolation_setting: str | None = None, why: str = "") -> BuildFlags:
    """Pure: which podman flags this host needs; ``isolation_setting`` (the caller's setting
    podman_isolation, ``why`` says where it came from) overrides the isolation."""
    reasons: list[str] = []
    isolation = None
    manager = None
    if facts.cgroup_fs != "cgroup2fs":
        reasons.append(f"cgroup filesystem is {facts.cgroup_fs}, not unified cgroup v2")
    if facts.in_container:
        reasons.append("running inside a container")
    if reasons:
        isolation = "chroot"
    if not facts.systemd_running:
        manager = "cgroupfs"
        reasons.append("systemd is not running")
    if isolation_setting:
        isolation = isolation_setting
        reasons.append(f"{why or 'podman_isolation'} set")
    return BuildFlags(isolation, manager, tuple(reasons))


PODMAN_FIX = "apt-get install podman (scripts/setup-debian does)"


def _podman(*args: str) -> runner.Done:
    """One podman command to its end; the caller reads its status (E006 when podman is not installed)."""
    return runner.run(["podman", *args], missing_fix=PODMAN_FIX)


def global_args(flags: BuildFlags) -> list[str]:
    return [f"--cgroup-manager={flags.cgroup_manager}"] if flags.cgroup_manager else []


@dataclass(frozen=True)
class BuildResult:
    image_id: str
    steps: int
    layer_steps: int
    cached_steps: int
    size: int = 0  # bytes, all layers (what `podman image ls` shows)


def build_command(
    context: Path, tag: str, flags: BuildFlags, containerfile: str = "Containerfile", *, offline: bool = False
) -> list[str]:
    """The argv of one build (``podman`` first, or the offline prefix before it)."""
    args = ["build", "--file", str(context / containerfile), "--tag", tag, "--layers=true"]
    if flags.isolation:
        args.append(f"--isolation={flags.isolation}")
    prefix, extra = flags.offline() if offline else ([], [])
    return [*prefix, "podman", *global_args(flags), *args, *extra, str(context)]


# A working container is made the moment its name appears in the build's output (the FROM
# line, the layer line before the next step): one made outside this window around that moment
# is another build's, even with the same name (two builds FROM the same image at once).
MADE_WITHIN_S = (-2.0, 15.0)


@dataclass
class BuildTrace:
    """The names one build's working containers can carry, read from its output as it streams,
    each with when it appeared (Unix seconds)."""

    stems: dict[str, float]

    def see(self, line: str, now: float | None = None) -> bool:
        """Note the name ``line`` gives; True when it is new."""
        m = _FROM.match(line)
        stem = m.group(1).rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0] if m else None
        m = _LAYER.match(line)
        stem = m.group(1)[:12] if m else stem
        if stem is None or stem in self.stems:
            return False
        self.stems[stem] = time.time() if now is None else now
        return True

    def owns(self, name: str, made: float) -> bool:
        m = _WORKING.match(name)
        if not m:
            return False
        stem, (early, late) = m.group(1), MADE_WITHIN_S
        return any((stem == s or (len(s) >= 8 and stem.startswith(s)) or (len(stem) >= 8 and s.startswith(stem)))
                   and at + early <= made <= at + late for s, at in self.stems.items())  # fmt: skip


def leftovers(before: set[str], now: dict[str, tuple[str, int]], trace: BuildTrace) -> list[str]:
    """Pure: the ids of working containers this build made and left (new since it started, named
    after one of its FROM images or layers when that name appeared), never another build's:
    builds run side by side here."""
    return sorted(cid for cid, (name, made) in now.items() if cid not in before and trace.owns(name, made))


def external_containers(flags: BuildFlags) -> dict[str, tuple[str, int]]:
    """Every container in podman's storage, buildah's working containers included:
    id -> (name, when it was made, Unix seconds)."""
    done = _podman(*global_args(flags), "ps", "-a", "--external", "--no-trunc", "--format", "json")
    if done.status != 0:
        return {}
    try:
        rows = json.loads(done.out or "[]")
        return {str(r["Id"]): (str((r.get("Names") or [""])[0]), int(r.get("Created", 0))) for r in rows}
    except (ValueError, KeyError, TypeError):
        return {}


def remove_leftovers(before: set[str], trace: BuildTrace, flags: BuildFlags, log: Callable[[str], None]) -> list[str]:
    """Remove (and so unmount) the working containers a build cut short left; a failure to
    remove one is said, not raised, so it never hides why the build stopped."""
    gone = []
    for cid in leftovers(before, external_containers(flags), trace):
        done = _podman(*global_args(flags), "rm", "--force", cid)
        if done.status == 0:
            gone.append(cid)
        else:
            log(f"image: could not remove working container {cid[:12]}: {done.err.strip()[-300:]} "
                f"(fix: podman rm --force {cid[:12]})")
    if gone:
        log(f"image: removed {len(gone)} working container(s) the stopped build left")
    return gone


@dataclass(frozen=True)
class Journal:
    """What a running build has made so far (``builds/<pid>-<start>-<thread>.json``; API jobs
    build in threads): a build killed outright (SIGKILL) cannot clean up, so the next build
    removes what it left."""

    path: Path
    before: frozenset[str]

    @classmethod
    def open(cls, before: set[str]) -> Journal:
        me = os.getpid()
        name = f"{me}-{runner.start_time(me) or 0}-{threading.get_ident()}.json"
        return cls(paths.cache_dir("builds") / name, frozenset(before))

    def write(self, trace: BuildTrace) -> None:
        """Whole or not at all: a temp name, then rename."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({"before": sorted(self.before), "stems": trace.stems}))
        os.replace(tmp, self.path)

    def close(self) -> None:
        self.path.unlink(missing_ok=True)


def heal_killed_builds(flags: BuildFlags, log: Callable[[str], None]) -> list[str]:
    """Remove the working containers of builds whose provision died (its journal left behind,
    its pid gone or reused, no podman build of it still running). Not while another build runs:
    its containers can carry the same names (same FROM image), so a build that runs alone heals."""
    gone: list[str] = []
    dead = []
    for journal in sorted(paths.cache_dir("builds").glob("*-*-*.json")):
        pid, start, _ = journal.stem.split("-", 2)
        if not (pid.isdigit() and start.isdigit()):
            continue
        if runner.start_time(int(pid)) == int(start):
            return []  # a provision build is running now
        if runner.children_running(int(pid)):
            return []  # a killed build is still being stopped (the reaper); the next build looks again
        dead.append(journal)
    for journal in dead:
        try:
            data = json.loads(journal.read_text())
            before = set(data["before"])
            trace = BuildTrace({str(k): float(v) for k, v in dict(data["stems"]).items()})
        except (OSError, ValueError, KeyError, TypeError):
            journal.unlink(missing_ok=True)
            continue
        gone += remove_leftovers(before, trace, flags, log)
        journal.unlink(missing_ok=True)
    return gone


def parse_step(line: str) -> str | None:
    """'STEP 3/5: RUN x' or '[2/2] STEP 3/5: RUN x' -> '3/5 RUN x' (stage prefix dropped)."""
    m = _STEP.match(line)
    return f"{m.group(1)}/{m.group(2)} {m.group(3)}" if m else None


def build(
    context: Path,
    tag: str,
    flags: BuildFlags,
    *,
    containerfile: str = "Containerfile",
    offline: bool = False,
    log: Callable[[str], None] | None = None,
) -> BuildResult:
    """Run podman build, streaming its output; on failure name the step that failed.
    ``offline``: no RUN step can reach the network (see BuildFlags.offline)."""
    runner.which("podman", fix=PODMAN_FIX)
    cmd = build_command(context, tag, flags, containerfile, offline=offline)
    if cmd[0] == "unshare":
        runner.which("unshare", fix="apt-get install util-linux")
        if os.geteuid() != 0:
            raise ImageBuildFailed(
                "an offline build with chroot isolation needs a network namespace of its own (unshare --net), "
                "which only root can make",
                fix="build as root, or set PROVISION_PODMAN_ISOLATION=oci where podman can run OCI isolation "
                "(then --network=none is used)",
            )
    log = log or say("image")
    steps: list[str] = []
    cached = 0

    heal_killed_builds(flags, log)
    trace = BuildTrace({})
    before = set(external_containers(flags))
    journal = Journal.open(before)
    journal.write(trace)

    def on_line(line: str) -> None:
        nonlocal cached
        log(line)
        if trace.see(line):
            journal.write(trace)
        step = parse_step(line)
        if step:
            steps.append(step)
        elif _CACHE_HIT.match(line):
            cached += 1

    # Tagged only when complete: a killed build leaves cached layers (the next build resumes from
    # them), never an image under ``tag``. The build stops with provision; podman gets 10 s to
    # let go of its layers when cut short. Cut short (a signal, a failed step), podman leaves
    # each stage's buildah working container mounted in its storage: they go on the way out.
    try:
        done = runner.run(cmd, name="podman-build", on_line=on_line, grace_s=10.0)
        if done.status != 0:
            remove_leftovers(before, trace, flags, log)
    except BaseException:
        remove_leftovers(before, trace, flags, log)
        raise
    finally:
        journal.close()
    if done.status != 0:
        failing = steps[-1] if steps else "(before the first step)"
        raise ImageBuildFailed(
            f"podman build of {tag} ({containerfile}{', network off' if offline else ''}) failed at STEP {failing} "
            f"(exit {done.status})\n" + done.last(),
            fix="fix the failing step (the output above shows its error) and build again; finished steps stay cached",
        )
    info = inspect(tag)
    layer_steps = sum(1 for s in steps if not s.split(" ", 1)[1].upper().startswith("FROM "))
    return BuildResult(
        image_id=info["Id"], steps=len(steps), layer_steps=layer_steps, cached_steps=cached,
        size=int(info.get("Size", 0)),
    )


def inspect(ref: str) -> dict:
    proc = _podman("image", "inspect", ref)
    if proc.status != 0:
        raise ImageBuildFailed(f"podman image inspect {ref} failed: {proc.err.strip()}")
    data = json.loads(proc.out)
    return dict(data[0])


def exists(ref: str) -> bool:
    return _podman("image", "exists", ref).status == 0


def import_rootfs(rootfs: Path, ref: str) -> str:
    """tar the directory into ``podman import``; returns the image id."""
    runner.which("podman", fix=PODMAN_FIX)
    with runner.start(["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], "tar", stdout=runner.PIPE) as tar:
        imp = runner.run(["podman", "import", "-", ref], name="podman-import", stdin=tar.stdout)
        if tar.stdout:
            tar.stdout.close()
        tar.wait()
    if imp.status != 0 or tar.returncode != 0:
        raise ImageBuildFailed(f"podman import of {rootfs} as {ref} failed: {imp.err.strip()}")
    return imp.out.strip().splitlines()[-1]


def export_rootfs(ref: str, dest: Path, flags: BuildFlags) -> Path:
    """Unpack an image's filesystem into ``dest`` (atomic: temp dir, then rename).

    The container is named after ``dest``, so one a killed export left behind is removed by the next.
    """
    tmp = dest.with_name(dest.name + ".partial")
    partials.remove(tmp)
    tmp.mkdir(parents=True)
    name = export_container_name(dest)
    _podman(*global_args(flags), "rm", "-f", name)
    created = _podman(*global_args(flags), "create", "--name", name, ref, "true")
    if created.status != 0:
        raise ImageBuildFailed(
            f"podman create of {ref} (to export its files) failed ({created.status}): {created.err.strip()[-600:]}",
            fix=f"check the image exists (`podman image exists {ref}`) and that podman works (`provision doctor`)",
        )
    cid = created.out.strip()
    try:
        with runner.start(["podman", *global_args(flags), "export", cid], "podman-export", stdout=runner.PIPE) as exp:
            untar = runner.run(["tar", "-x", "-C", str(tmp), "--numeric-owner"], stdin=exp.stdout)
            if exp.stdout:
                exp.stdout.close()
            exp.wait()
        if exp.returncode or untar.status:
            raise ImageBuildFailed(f"podman export of {ref} failed: {untar.err.strip()}")
    finally:
        _podman(*global_args(flags), "rm", "-f", cid)
    partials.remove(dest)
    tmp.rename(dest)
    return dest


def export_container_name(dest: Path) -> str:
    return "krun-gpu-export-" + hashlib.sha256(str(dest.resolve()).encode()).hexdigest()[:12]


def labels(ref: str) -> dict[str, str]:
    return dict(inspect(ref).get("Labels") or {})

