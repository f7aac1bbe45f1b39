"""The fault matrix on the Linux Venus route, with real QEMU (TCG here) and virglrenderer.

`provision run llama-linux --gpu` is stopped every way a user, a supervisor or a crash stops it,
once its guest has Venus up: SIGINT, SIGTERM, SIGHUP and SIGKILL to provision, SIGKILL to QEMU
and to the render server (QEMU's GL display is SDL offscreen in QEMU itself: no X server).
Each time, within 10 s no process of that run is left (checked
by pid, by process group, and by scanning /proc for qemu-system/Xvfb/virgl_render_server whose
command line or mounts name the run directory), every GPU slot is free, and the next GPU run
comes up on Venus. A SIGKILL during `host-tools` and during `image build` leaves the next run
working. Boots are the cost, so two lanes (one per GPU slot) run side by side, each on a cache of
its own whose host tools and VM disk are links to the shared ones (never written: runs only read
them, and the `host-tools --force` that is killed builds beside them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provision.adapters import procs
from provision.core import catalog
from provision.hosts.linux.run import facts as linux
from provision.hosts.linux.run import slots
from provision.hosts.linux.tools import host_tools
from tests.helpers import catalog_file_with

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman]

UP = "krun-venus-up"
GUEST = f"vulkaninfo --summary 2>&1 | grep -q DRIVER_ID_MESA_VENUS && echo {UP}; sleep 120"
WITHIN_S = 10.0
NAMES = re.compile(r"^(qemu-system|Xvfb|virgl_render)")


@dataclass
class Lane:
    cache: Path
    results: list[dict[str, object]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != host_tools.ENV_VAR}
        return {**env, "PROVISION_CACHE": str(self.cache)}

    def provision(self, *args: str, **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "provision", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=self.env,
            **kw,  # type: ignore[arg-type]
        )

    def slots_free(self) -> bool:
        n = slots.slot_count()
        held = [slots.try_acquire(n, self.cache / "gpu-slots") for _ in range(n)]
        for s in held:
            if s:
                s.release()
        return all(held)


@pytest.fixture(scope="module")
def shared() -> tuple[Path, Path]:
    """The shared host-tools chroot and the llama-linux VM disk directory (made when missing)."""
    tools = host_tools.make()
    disk = linux.root_disk(catalog.load().get("llama-linux"))
    return tools.root, disk.directory


def make_lane(base: Path, shared: tuple[Path, Path]) -> Lane:
    tools, disk = shared
    (base / "host-tools").mkdir(parents=True)
    (base / "vm-disks").mkdir()
    (base / "host-tools" / tools.name).symlink_to(tools)
    (base / "vm-disks" / disk.name).symlink_to(disk)
    src = tools.parent.parent / "sources"  # the pinned sdist an image build links into its context
    if src.is_dir():
        (base / "sources").symlink_to(src)
    return Lane(base)


class Watched:
    """A running `provision run --gpu`, its output collected by two threads."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.out, self.err = proc, "", ""
        self.threads = [
            threading.Thread(target=self._pump, args=(proc.stdout, "out"), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, "err"), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def _pump(self, stream: object, name: str) -> None:
        for line in stream:  # type: ignore[attr-defined]
            setattr(self, name, getattr(self, name) + line)

    def wait_for(self, what: Callable[[], bool], within: float, label: str) -> None:
        deadline = time.monotonic() + within
        while not what():
            assert self.proc.poll() is None, (
                f"provision exited ({self.proc.returncode}) before {label}: {self.err[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no {label} within {within} s: {self.err[-3000:]}"
            time.sleep(0.2)

    def finish(self, timeout: float = 60) -> int:
        rc = self.proc.wait(timeout=timeout)
        for t in self.threads:
            t.join(timeout=5)
        return rc


def scan(run_id: str) -> list[str]:
    """qemu-system / Xvfb / virgl_render_server processes whose command line or mounts name the run."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            if not NAMES.match(comm) or procs.start_time(int(entry.name)) is None:
                continue
            text = (entry / "cmdline").read_bytes().decode(errors="replace") + (entry / "mountinfo").read_text()
        except OSError:
            continue
        if run_id in text:
            found.append(f"{comm} {entry.name}")
    return found


def left_over(pids: dict[str, int], groups: set[int], run_id: str) -> list[str]:
    alive = [f"{n} {p}" for n, p in pids.items() if procs.start_time(p) is not None]
    members = [f"pgid {g}: {procs.group_members(g)}" for g in groups if procs.group_members(g)]
    return alive + members + scan(run_id)


def _state(pid: int) -> str:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "gone"
    return next((line for line in status.splitlines() if line.startswith("State")), "?") + f" wchan={wchan}"


def reaper_of(pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and procs.parent(int(entry.name)) == pid:
            try:
                if b"provision.adapters.reaper" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    raise AssertionError(f"provision {pid} has no reaper")


EXPECTED = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "SIGKILL": -9}


def fault_case(
    lane: Lane, target: str, sig: str, before: Callable[[dict[str, int]], None] | None = None
) -> dict[str, object]:
    """One GPU run brought up to Venus, then ``sig`` to ``target`` (``before`` sees the pids first); returns the
    measured outcome."""
    w = Watched(lane.provision("run", "llama-linux", "--gpu", "--timeout", "1500", "--", "sh", "-c", GUEST))
    w.wait_for(lambda: "qemu pid=" in w.err, 300, "QEMU start")
    qemu = int(re.search(r"qemu pid=(\d+)", w.err).group(1))  # type: ignore[union-attr]
    run_dir = Path(re.search(r"run=(\S+)", w.err).group(1))  # type: ignore[union-attr]
    booted = time.monotonic()
    w.wait_for(lambda: UP in w.out, 900, "Venus in the guest")
    boot_s = time.monotonic() - booted
    w.wait_for(lambda: any(r.name == "render-server" for r in procs.records(run_dir)), 30, "the render server")
    recs = {r.name: r for r in procs.records(run_dir)}
    pids = {
        "provision": w.proc.pid,
        "reaper": reaper_of(w.proc.pid),
        "qemu": qemu,
        "render-server": recs["render-server"].pid,
    }
    groups = {r.pgid for r in recs.values()}
    if before is not None:
        before(pids)
    # QEMU itself holds the GPU slot's lock: the slot lives exactly as long as the guest.
    assert any("gpu-slots/slot-" in os.readlink(f) for f in map(str, Path(f"/proc/{qemu}/fd").iterdir()))
    sent = time.monotonic()
    os.kill(pids[target], getattr(signal, sig))
    clean = None
    while time.monotonic() - sent < 30:
        if not left_over(pids, groups, run_dir.name) and lane.slots_free():
            clean = time.monotonic() - sent
            break
        time.sleep(0.1)
    late = {n: _state(p) for n, p in pids.items() if procs.start_time(p) is not None}  # what a failure names
    rc = w.finish()
    result = {
        "target": target,
        "signal": sig,
        "boot_to_venus_s": round(boot_s, 1),
        "clean_s": None if clean is None else round(clean, 2),
        "exit": rc,
        "left": left_over(pids, groups, run_dir.name),
        "slots_free": lane.slots_free(),
    }
    lane.results.append(result)
    assert clean is not None and clean <= WITHIN_S, (result, late, w.err[-1500:])
    if target == "provision":
        assert rc == EXPECTED[sig], (result, w.err[-2000:])
    else:
        assert rc == 34 and "E024" in w.err, (result, w.err[-2000:])  # the run ends with its own error
    assert procs.records(run_dir) == []
    return result


def final_run(lane: Lane) -> dict[str, object]:
    started = time.monotonic()
    w = Watched(
        lane.provision(
            "run", "llama-linux", "--gpu", "--timeout", "900", "--", "sh", "-c", "vulkaninfo --summary | grep -q VENUS"
        )
    )
    rc = w.finish(timeout=960)
    result = {"target": "next run", "signal": "-", "exit": rc, "wall_s": round(time.monotonic() - started, 1)}
    lane.results.append(result)
    assert rc == 0, w.err[-3000:]
    return result


def kill_image_build(lane: Lane) -> None:
    """SIGKILL `image build llama-linux` while podman works; nothing of it may run on.

    With warm caches every layer of the real stack is cached and podman is done in under a second,
    so the build's catalog adds one verify step no cache has seen (a fresh number in it) that takes
    a minute: the kill lands in a podman build that is running a step, every time."""
    step = f"sleep 60 0.{os.getpid()}{time.time_ns()}"  # sleep adds its arguments: a minute, a new layer
    slow_step = catalog_file_with(lane.cache, lambda d: d["stacks"]["llama-linux"]["verify"].append(step))
    w = Watched(lane.provision("image", "build", "llama-linux", "--catalog", str(slow_step)))
    jobs = lane.cache / "jobs"
    found: list[procs.Record] = []

    def in_slow_step() -> bool:
        found[:] = [r for d in jobs.glob("*") for r in procs.records(d) if r.name == "podman-build"]
        return bool(found) and f"RUN {step}" in w.err + w.out

    w.wait_for(in_slow_step, 600, "podman build at its uncached step")
    (rec,) = found
    assert rec.alive(), "podman build ended before it could be killed"
    w.proc.kill()
    sent = time.monotonic()
    w.finish()
    while (rec.alive() or procs.group_members(rec.pgid)) and time.monotonic() - sent < 30:
        time.sleep(0.1)
    clean = time.monotonic() - sent
    lane.results.append({"target": "image build (podman)", "signal": "SIGKILL", "clean_s": round(clean, 2)})
    assert clean <= WITHIN_S


def kill_host_tools(lane: Lane) -> None:
    """SIGKILL `host-tools --force` during debootstrap: no debootstrap left, no mount, the next run works."""
    w = Watched(lane.provision("host-tools", "--force"))
    building = host_tools.cache_key() + ".building.partial"
    w.wait_for(lambda: (lane.cache / "host-tools" / building / "debootstrap").exists(), 300, "debootstrap")
    time.sleep(1)
    recs = [r for d in (lane.cache / "jobs").glob("*") for r in procs.records(d)]
    assert [r.name for r in recs] == ["debootstrap"]
    w.proc.kill()
    sent = time.monotonic()
    w.finish()
    while any(r.alive() or procs.group_members(r.pgid) for r in recs) and time.monotonic() - sent < 30:
        time.sleep(0.1)
    clean = time.monotonic() - sent
    mounts = Path("/proc/self/mountinfo").read_text()
    lane.results.append({"target": "host-tools (debootstrap)", "signal": "SIGKILL", "clean_s": round(clean, 2)})
    assert clean <= WITHIN_S
    assert str(lane.cache) not in mounts  # debootstrap's /proc and /sys were in its own mount namespace
    leftovers = sorted(p.name for p in (lane.cache / "host-tools").iterdir() if ".building" in p.name)
    assert leftovers, "the kill left nothing to heal"
    # The next host-tools finds the half-made tree, removes it, and keeps the whole one.
    again = lane.provision("host-tools")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    assert "did not finish" in err
    assert not [p for p in (lane.cache / "host-tools").iterdir() if ".building" in p.name]


@pytest.fixture
def lanes(tmp_path: Path, shared: tuple[Path, Path]) -> list[Lane]:
    return [make_lane(tmp_path / f"lane{i}", shared) for i in (1, 2)]


def test_fault_matrix_every_way_of_stopping_a_gpu_run_leaves_nothing_and_the_next_run_works(lanes: list[Lane]) -> None:
    one, two = lanes

    def lane_one() -> None:
        for sig in ("SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"):
            fault_case(one, "provision", sig)
        kill_image_build(one)
        final_run(one)

    def lane_two() -> None:
        for target in ("qemu", "render-server"):
            fault_case(two, target, "SIGKILL")
        kill_host_tools(two)
        final_run(two)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(lane_one), pool.submit(lane_two)]
        errors = [j.exception() for j in jobs]
    report = {"wall_s": round(time.monotonic() - started, 1), "lanes": [one.results, two.results]}
    print("fault matrix:", json.dumps(report, indent=1))
    for e in errors:
        if e is not None:
            raise e



def _user_of(pid: int) -> tuple[set[str], str]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return set(status["Uid"].split()) | set(status["Gid"].split()), status["NoNewPrivs"].strip()


def test_sigkill_to_a_root_provision_stops_its_sandboxed_qemu_and_render_server(
    tmp_path: Path, shared: tuple[Path, Path]
) -> None:
    """The privilege drop clears PDEATHSIG: the reaper (root) alone must stop the krun-guest processes."""
    assert os.geteuid() == 0, "the Linux route enters its tools chroot as root (CI runs it under sudo)"
    lane = make_lane(tmp_path / "lane", shared)

    def unprivileged(pids: dict[str, int]) -> None:
        for name in ("qemu", "render-server"):
            ids, no_new_privs = _user_of(pids[name])
            assert "0" not in ids and no_new_privs == "1", (name, ids, no_new_privs)

    fault_case(lane, "provision", "SIGKILL", before=unprivileged)
    print("sandboxed SIGKILL:", json.dumps(lane.results))

HOLDER = """
import subprocess
import sys
from pathlib import Path
from provision.adapters import procs
from provision.hosts.linux.run import slots
Path(sys.argv[1]).mkdir(parents=True, exist_ok=True)
slot = slots.try_acquire(1, Path(sys.argv[1]))
assert slot is not None
# tie=False: a guest meant to outlive its provision (serve --detach); it keeps the slot's lock.
child = procs.spawn(
    ["sleep", "300"], Path(sys.argv[2]), "qemu", keep_fds=(slot.fd,), tie=False,
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(child.pid, flush=True)
"""


def test_a_gpu_run_waits_while_an_orphan_holds_the_slot_and_starts_once_it_is_gone(
    tmp_path: Path, shared: tuple[Path, Path]
) -> None:
    lane = make_lane(tmp_path / "lane", shared)
    env = {**lane.env, "PROVISION_GPU_SLOTS": "1"}
    holder = subprocess.run(
        [sys.executable, "-c", HOLDER, str(lane.cache / "gpu-slots"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    orphan = int(holder.stdout)
    try:
        assert procs.start_time(orphan) is not None  # its provision is gone, it lives on with the slot
        proc = subprocess.run(
            [sys.executable, "-m", "provision", "run", "llama-linux", "--gpu", "--timeout", "5", "--", "true"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 32 and "E022" in proc.stderr, proc.stderr[-2000:]
        assert "qemu pid=" not in proc.stderr
        # A run with time to wait: it waits while the orphan lives, and starts once it is gone.
        log = tmp_path / "waiting.stderr"
        with log.open("w") as err:
            waiting = subprocess.Popen(
                [sys.executable, "-m", "provision", "run", "llama-linux", "--gpu", "--timeout", "900", "--",
                 "sh", "-c", "echo started-after-the-orphan"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env,
            )
        try:
            time.sleep(5)
            assert waiting.poll() is None and "qemu pid=" not in log.read_text()  # still waiting for the slot
        except BaseException:
            waiting.kill()
            raise
    finally:
        os.kill(orphan, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        out, _ = waiting.communicate(timeout=880)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    text = log.read_text()
    assert waiting.returncode == 0, text[-2000:]
    assert "qemu pid=" in text and out.strip() == "started-after-the-orphan"
    assert time.monotonic() > killed_at
    free = slots.try_acquire(1, lane.cache / "gpu-slots")
    assert free is not None  # the run released it; the orphan's lock dropped with it
    free.release()
