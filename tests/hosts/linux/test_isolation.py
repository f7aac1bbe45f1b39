"""Guest isolation without a VM: QEMU's sandbox and network on the command line, the privilege
drop into a real chroot, the krun-guest user in a tree, limits checked before anything
starts, and what doctor reports. The macOS `podman run` flags: tests/hosts/darwin/test_macos_isolation.py."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from provision.adapters import procs, qemu
from provision.adapters.chroot import Chroot
from provision.core import errors, isolation
from provision.hosts.linux import doctor_isolation
from provision.hosts.linux.doctor_isolation import user_check
from provision.hosts.linux.tools import guest_user, host_tools

DENY_ALL = ("obsolete=deny", "elevateprivileges=deny", "spawn=deny", "resourcecontrol=deny")


def _spec(gpu: bool) -> qemu.VmSpec:
    return qemu.VmSpec(
        kernel="/vm/vmlinuz",
        initrd="/vm/initrd",
        root=qemu.Drive("/vm/root.img", "krun-root"),
        drives=(qemu.Drive("/run/job.img", "krun-job"), qemu.Drive("/models/m.img", "krun-model")),
        console_log="/run/console.log",
        stdout_log="/run/stdout.log",
        stderr_log="/run/stderr.log",
        gpu=gpu,
        display="sdl" if gpu else "none",
        sandbox=isolation.sandbox_option(gpu),
    )


def test_cpu_guest_gets_every_sandbox_set_denied_and_no_nic() -> None:
    argv = qemu.argv(_spec(gpu=False))
    sandbox = argv[argv.index("-sandbox") + 1].split(",")
    assert sandbox[0] == "on" and set(DENY_ALL) <= set(sandbox)
    assert argv[argv.index("-nic") + 1] == "none"
    assert not any(a.startswith(("-netdev", "-net")) and a != "-nic" for a in argv)
    assert "-nodefaults" in argv  # no default NIC, serial or monitor either


def test_gpu_guest_keeps_obsolete_and_resourcecontrol_denied_and_no_nic() -> None:
    argv = qemu.argv(_spec(gpu=True))
    sandbox = argv[argv.index("-sandbox") + 1].split(",")
    assert {"on", "obsolete=deny", "resourcecontrol=deny"} <= set(sandbox)
    # The render server is fork+exec'd from QEMU after the filter is in place (see provision/core/isolation.py).
    assert {"spawn=allow", "elevateprivileges=allow"} <= set(sandbox)
    assert argv[argv.index("-nic") + 1] == "none"


def test_root_job_and_model_disks_are_read_only_and_root_mounts_ro() -> None:
    for gpu in (False, True):
        argv = qemu.argv(_spec(gpu))
        drives = [argv[i + 1] for i, a in enumerate(argv) if a == "-drive"]
        assert len(drives) == 3 and all(d.endswith(",readonly=on") for d in drives)
        assert " ro " in f" {argv[argv.index('-append') + 1]} "


# --- the privilege drop, for real ---------------------------------------------------------


@pytest.fixture(scope="module")
def mini_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with sh, id, cat and their libraries: enough to watch a program after the drop."""
    root = tmp_path_factory.mktemp("tree")
    root.chmod(0o755)  # pytest makes it 0700; it is the user's "/"
    for d in ("proc", "sys", "dev", "etc", "tmp"):
        (root / d).mkdir()
    for prog in ("sh", "id", "cat", "env", "touch", "grep", "sleep"):
        src = Path(shutil.which(prog) or f"/bin/{prog}").resolve()
        wanted = {src}
        ldd = subprocess.run(["ldd", str(src)], capture_output=True, text=True).stdout
        wanted |= {Path(w) for w in ldd.split() if w.startswith("/")}
        for f in wanted:
            dest = root / str(f).lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)
        for d in ("usr/bin", "bin"):
            (root / d).mkdir(parents=True, exist_ok=True)
            if not (root / d / prog).exists():
                os.symlink(str(src), root / d / prog)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    (root / "etc/owned-by-root").write_text("x\n")
    return root


@pytest.mark.root
def test_program_in_the_chroot_runs_as_the_user_with_no_new_privs(mini_root: Path, tmp_path: Path) -> None:
    assert os.geteuid() == 0, "entering a chroot needs root (the CI main job runs under sudo)"
    user = guest_user.ensure_user(mini_root)
    logs = tmp_path / "run"
    logs.mkdir()
    guest_user.hand_over([logs / "console.log"], user)
    ch = Chroot(mini_root).with_binds({logs: "/mnt/krun/run"}).as_user(user.uid, user.gid, (user.gid,))
    script = (
        "id -u; id -g; id -G; grep -E '^(NoNewPrivs|CapEff)' /proc/self/status; "
        "echo written > /mnt/krun/run/console.log && echo log-ok; "
        "touch /etc/owned-by-root 2>&1 || echo root-file-refused; touch /mnt/krun/run/new 2>&1 || echo rundir-refused"
    )
    proc = subprocess.run(ch.argv(["sh", "-c", script]), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == [str(user.uid), str(user.gid), str(user.gid)]
    assert "NoNewPrivs:\t1" in proc.stdout and "CapEff:\t0000000000000000" in proc.stdout
    assert "log-ok" in lines and (logs / "console.log").read_text() == "written\n"
    assert "root-file-refused" in lines and "rundir-refused" in lines
    assert not (logs / "new").exists()
    # Without a user the same tree runs the program as root (the tools' own setup steps).
    as_root = subprocess.run(Chroot(mini_root).argv(["id", "-u"]), capture_output=True, text=True, timeout=60)
    assert as_root.stdout.strip() == "0"


# A root provision's run, reduced to the drop: the program enters the chroot as krun-guest in the
# process group procs.spawn made; then the owner is SIGKILLed and only the reaper is left to stop it.
OWNER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    from pathlib import Path
    from provision.adapters import procs
    from provision.adapters.chroot import Chroot
    from provision.hosts.linux.run import isolation

    root, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    master, slave = os.openpty()
    user = isolation.run_user(root, is_chroot=True, accel="tcg", gpu=False, dry_run=False)
    isolation.hand_over([run_dir / n for n in ("console.log", "stdout.log", "stderr.log")], os.ttyname(slave), user)
    ch = Chroot(root).with_binds({run_dir: "/mnt/krun/run"}).as_user(user.uid, user.gid, user.groups)
    p = procs.spawn(ch.argv(["sh", "-c", "sleep 300 & echo $! > /mnt/krun/run/console.log; wait"]), run_dir, "qemu",
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = run_dir / "console.log"
    while not log.read_text().endswith("\\n"):
        time.sleep(0.02)
    print(json.dumps({"child": p.pid, "grandchild": int(log.read_text()), "reaper": procs.reaper_pid(),
                      "uid": user.uid, "tty_uid": os.stat(os.ttyname(slave)).st_uid}), flush=True)
    sys.stdin.read()
    """
)


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


@pytest.mark.root
def test_sigkill_of_a_root_owner_stops_its_dropped_program_through_the_reaper(mini_root: Path, tmp_path: Path) -> None:
    """The change of user clears PDEATHSIG; the process group (and so the reaper's kill) is kept."""
    assert os.geteuid() == 0, "entering a chroot needs root (the CI main job runs under sudo)"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(mini_root), str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PROVISION_CACHE": str(tmp_path / "cache")},
    )
    assert owner.stdout is not None
    pids = json.loads(owner.stdout.readline())
    assert pids["tty_uid"] == pids["uid"] != 0  # a shell's pty is QEMU's to open
    for name in ("child", "grandchild"):
        st = _status(pids[name])
        assert st["Uid"].split()[0] == str(pids["uid"]) and st["NoNewPrivs"] == "1", (name, st["Uid"])
    assert os.getpgid(pids["grandchild"]) == os.getpgid(pids["child"]) == pids["child"]
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 10
    left = [p for p in (pids["child"], pids["grandchild"]) if procs.start_time(p) is not None]
    while (left or procs.records(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if procs.start_time(p) is not None]
    assert left == [], "the reaper did not stop the krun-guest processes"
    assert procs.records(run_dir) == []  # the reaper forgets what it stopped


def test_guest_user_is_added_once_with_ids_free_on_the_host(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nold:x:64990:64990::/:/bin/sh\n")
    (tree / "etc/group").write_text("root:x:0:\n")
    host = tmp_path / "host"
    host.mkdir()
    (host / "passwd").write_text("root:x:0:0::/root:/bin/sh\nsite:x:64989:64989::/:/bin/sh\n")
    (host / "group").write_text("root:x:0:\nsite:x:64988:\n")
    first = guest_user.ensure_user(tree, host_etc=host)
    assert first.uid == first.gid == 64987  # 64990, 64989, 64988 are taken in the tree or on the host
    again = guest_user.ensure_user(tree, host_etc=host)
    assert again == first
    passwd = (tree / "etc/passwd").read_text()
    assert passwd.count("\nkrun-guest:x:") == 1 and passwd.startswith("root:x:0:0")
    assert (tree / "etc/group").read_text().count("\nkrun-guest:x:") == 1
    home = tree / isolation.GUEST_HOME.lstrip("/")
    assert (home.stat().st_uid, home.stat().st_mode & 0o777) == (first.uid, 0o700)
    assert not list((tree / "etc").glob(".*tmp"))


# --- limits ---------------------------------------------------------------------------------


def test_limits_outside_their_ranges_are_e003_with_a_fix() -> None:
    ok = isolation.GuestLimits(memory_mib=1024, cpus=1, timeout_s=60)
    assert isolation.check_limits(ok, host_cpus=2, host_memory_mib=4096) == ok
    for bad in (
        isolation.GuestLimits(cpus=0),
        isolation.GuestLimits(cpus=3),
        isolation.GuestLimits(memory_mib=100),
        isolation.GuestLimits(memory_mib=8192),
        isolation.GuestLimits(timeout_s=0),
        isolation.GuestLimits(pids=1),
    ):
        with pytest.raises(errors.InvalidValue) as exc:
            isolation.check_limits(bad, host_cpus=2, host_memory_mib=4096)
        assert exc.value.fix and "--" in exc.value.fix


def test_run_refuses_out_of_range_flags_before_any_vm(tmp_path: Path) -> None:
    env = {**os.environ, "PROVISION_CACHE": str(tmp_path)}
    for flags in (["--cpus", "0"], ["--cpus", str((os.cpu_count() or 1) + 1)], ["--timeout", "0"], ["--memory", "64"]):
        proc = subprocess.run(
            [sys.executable, "-m", "provision", "run", "llama-linux", *flags, "--", "true"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert proc.returncode == errors.InvalidValue.exit_status, proc.stderr
        assert "E003" in proc.stderr and "fix:" in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "runs").exists()


# --- doctor ------------------------------------------------------------------------------------


def _rows() -> dict[str, object]:
    tools = host_tools.HostTools(Path("/"), "host")
    return {c.id: c for c in doctor_isolation.plan_checks(doctor_isolation._sample_plans(tools))}


def test_doctor_reports_sandbox_network_mounts_and_user() -> None:
    by_id = _rows()
    assert all(c.status == "ok" for c in by_id.values())  # type: ignore[attr-defined]
    # The rows quote the planned command lines: the CPU filter denies spawn, the GPU one allows it.
    assert f"CPU guests: QEMU -sandbox {isolation.SANDBOX_FULL}" in by_id["linux.isolation.sandbox"].evidence  # type: ignore[attr-defined]
    assert f"GPU guests: QEMU -sandbox {isolation.SANDBOX_GPU}" in by_id["linux.isolation.sandbox"].evidence  # type: ignore[attr-defined]
    assert user_check(1000, None, False).status == "ok"
    assert user_check(0, Path("/"), False).status == "warn"


@pytest.mark.parametrize(
    ("row", "target", "broken"),
    [
        ("linux.isolation.sandbox", "provision.hosts.linux.run.runplan.sandbox_option", lambda gpu: None),
        ("linux.isolation.network", "provision.adapters.qemu.network_args",
         lambda spec: ["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"]),
        ("linux.isolation.mounts", "provision.adapters.qemu.Drive", functools.partial(qemu.Drive, readonly=False)),
    ],
)
def test_a_run_configuration_that_loses_its_isolation_turns_doctor_s_row_into_a_failure(
    monkeypatch: pytest.MonkeyPatch, row: str, target: str, broken: object
) -> None:
    # The rows come from what the run would do: change the run's configuration and doctor says so.
    assert _rows()[row].status == "ok"  # type: ignore[attr-defined]
    monkeypatch.setattr(target, broken)
    assert _rows()[row].status == "fail", _rows()[row]  # type: ignore[attr-defined]


def test_doctor_json_has_the_isolation_checks() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "provision", "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    ids = {c["id"]: c for c in json.loads(proc.stdout)["data"]["checks"]}
    for cid in ("linux.isolation.sandbox", "linux.isolation.network", "linux.isolation.mounts", "linux.isolation.user"):
        assert cid in ids, sorted(ids)
    # The JSON rows are the ones planned from this host's tools, not a fixed text.
    tools = host_tools.locate() or host_tools.HostTools(Path("/"), "host")
    planned = doctor_isolation.plan_checks(doctor_isolation._sample_plans(tools))
    for check in planned:
        assert ids[check.id]["evidence"] == check.evidence and ids[check.id]["status"] == check.status
