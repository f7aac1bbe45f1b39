"""`--dry-run` prints what starts: the plan's argv, environment, user, root and working directory are
what the process tree receives, for `provision run`, `serve` and `shell`; and a dry run writes and
fetches nothing.

QEMU is a stand-in installed as the tools' own QEMU (a `--from` bundle, or a chroot tree): it
writes what it received (argv, environment, uid, working directory, a file only its root holds) to
the guest's stdout serial file, which the real watch loop copies to provision's stdout, and ends
the guest through the console as an init would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provision.core import catalog
from provision.hosts.linux.run import facts
from provision.hosts.linux.tools import host_tools
from tests.helpers import run_provision
from tests.hosts.linux.stand_in import STAND_IN, TREE_MARK, install_bundle


def received(stdout: str) -> dict[str, Any]:
    """What the stand-in QEMU wrote: argv, env, uid, cwd, root."""
    stdout = stdout.replace("\r\n", "\n")  # a shell's pty turns each newline into CR LF
    body = stdout[stdout.index("@@argv\n"):stdout.index("\n@@end")]
    parts = dict(chunk.split("\n", 1) for chunk in body.split("@@")[1:])
    env = dict(item.split("=", 1) for item in parts["env"].rstrip("\n").split("\0") if item)
    return {"argv": parts["argv"].rstrip("\n").split("\0")[:-1], "env": env, "uid": int(parts["uid"].strip()),
            "pid": int(parts["pid"].strip()), "cwd": parts["cwd"].strip(), "root": parts["root"].strip()}  # fmt: skip


@pytest.fixture
def stand_in(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(host_tools.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin:/usr/sbin:/sbin")  # no QEMU of the host's own in the way
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    return install_bundle(catalog.load().get("cpu"))


def the_run_dir(cache: Path) -> Path:
    (run_dir,) = [p for p in (cache / "runs").iterdir() if p.is_dir()]
    return run_dir


def assert_received_is_planned(dry: dict[str, Any], got: dict[str, Any], run_dir: Path, **placeholders: str) -> None:
    """The dry run's plan, its made-at-run-time names replaced by the ones the run made, is what QEMU got."""
    fill = {dry["run_dir"]: str(run_dir), **placeholders}

    def filled(text: str) -> str:
        for planned, made in fill.items():
            text = text.replace(planned, made)
        return text

    argv = [filled(a) for a in dry["argv"]]
    if dry["inherit_env"]:  # provision starts QEMU itself
        assert got["argv"] == argv
    else:  # provision starts the chroot wrapper, which execs (same pid) into QEMU's own command line
        program = [filled(a) for a in dry["qemu_argv"]]
        assert argv[-len(program):] == program
        assert got["argv"][1:] == program[1:] and got["argv"][0] == f"/usr/bin/{program[0]}"
    planned_env = {k: filled(v) for k, v in dry["env"].items()}
    if dry["inherit_env"]:  # provision's environment with the plan's over it
        assert {k: got["env"].get(k) for k in planned_env} == planned_env
        extra = set(got["env"]) - set(planned_env) - set(os.environ)
        assert {k for k in extra if not k.startswith("PROVISION_")} == set()  # main hands settings on
    else:
        assert got["env"] == planned_env
    assert got["uid"] == (dry["user"]["uid"] if dry["user"] else os.geteuid())
    assert got["cwd"] == filled(dry["cwd"])
    assert got["root"] == ("host" if dry["root"] == "/" else TREE_MARK)
    # and the plan the run kept beside its logs is that same plan
    kept = json.loads((run_dir / "plan.json").read_text())
    assert kept["argv"] == argv and kept["env"] == planned_env and kept["user"] == dry["user"]


def test_run_dry_run_is_what_qemu_receives(stand_in: Path, empty_cache: Path) -> None:
    args = ("cpu", "--memory", "1024", "--", "echo", "a b")
    dry = run_provision("run", "cpu", "--dry-run", "--json", *args[1:])
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["data"]
    assert plan["argv"][0] == str(stand_in / host_tools.QEMU) and plan["inherit_env"] and plan["user"] is None
    assert not (empty_cache / "runs").exists()  # the dry run made no run directory
    real = run_provision("run", *args)
    assert real.returncode == 0, real.stderr
    got = received(real.stdout)
    assert f"qemu pid={got['pid']} " in real.stderr  # the process provision started is the one that reported
    assert_received_is_planned(plan, got, the_run_dir(empty_cache))


def test_serve_dry_run_is_what_qemu_receives(stand_in: Path, empty_cache: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    args = ("serve", "cpu", "--model", str(model), "--port", "18093", "--wait", "30")
    dry = run_provision(*args, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["data"]
    assert "hostfwd=tcp:127.0.0.1:18093-:8080" in " ".join(plan["argv"])
    assert "exec llama-server" in plan["job"] and not (empty_cache / "model-disks").exists()
    # The guest ends at once (no llama-server answers): serve fails with its E-code, after QEMU started.
    real = run_provision(*args)
    assert real.returncode != 0 and "Traceback" not in real.stderr
    (disk,) = (empty_cache / "model-disks").glob("*.img")
    assert_received_is_planned(plan, received(real.stdout), the_run_dir(empty_cache),
                               **{str(empty_cache / "model-disks" / f"{facts.AT_RUN_TIME}.img"): str(disk)})


def test_shell_dry_run_is_what_qemu_receives(
    stand_in: Path, empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in {"TERM": "xterm", "COLUMNS": "90", "LINES": "30"}.items():  # the shell's size and terminal type
        monkeypatch.setenv(k, v)
    dry = run_provision("shell", "cpu", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)["data"]
    # The shell's pty: provision makes it at run time, so the stand-in tells which one it got.
    real = subprocess.run([sys.executable, "-m", "provision", "shell", "cpu"], capture_output=True, text=True,
                          errors="replace", stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
    assert real.returncode == 0, real.stderr
    got = received(real.stdout)
    pty = next(a.split("path=", 1)[1] for a in got["argv"] if a.startswith("serial,id=out,path="))
    assert pty.startswith("/dev/pts/") and "stty sane rows 30 cols 90" in plan["job"]
    assert_received_is_planned(plan, got, the_run_dir(empty_cache), **{"/dev/pts/made-at-run-time": pty})


@pytest.mark.root
def test_a_root_run_in_a_chroot_receives_the_planned_user_root_and_whole_environment(
    empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools are a chroot tree and provision is root: the plan drops to krun-guest, and QEMU gets
    exactly the plan's environment (env -i), its root and working directory."""
    from provision.hosts import RunIO, RunRequest, get
    from provision.images import disks

    assert os.geteuid() == 0, "entering a chroot needs root (the CI main job runs under sudo)"
    tree = tmp_path / "tree"
    tree.mkdir(mode=0o755)
    for d in ("proc", "sys", "dev", "etc", "tmp", "usr/bin", "bin"):
        (tree / d).mkdir(parents=True, exist_ok=True)
    for prog in ("sh", "id", "cat", "pwd"):
        src = Path(shutil.which(prog) or f"/bin/{prog}").resolve()
        ldd = subprocess.run(["ldd", str(src)], capture_output=True, text=True).stdout
        for f in {src, *(Path(w) for w in ldd.split() if w.startswith("/"))}:
            (tree / str(f).lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, tree / str(f).lstrip("/"))
        for d in ("usr/bin", "bin"):
            if not (tree / d / prog).exists():
                os.symlink(str(src), tree / d / prog)
    (tree / "usr/bin/env").unlink(missing_ok=True)
    env_src = Path(shutil.which("env") or "/usr/bin/env").resolve()
    shutil.copy2(env_src, tree / "usr/bin/env")
    (tree / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (tree / "etc/group").write_text("root:x:0:\n")
    (tree / TREE_MARK).write_text(TREE_MARK)
    (tree / host_tools.QEMU).write_text(STAND_IN)
    (tree / host_tools.QEMU).chmod(0o755)
    monkeypatch.setenv(host_tools.ENV_VAR, str(tree))
    vm = tmp_path / "vm"
    vm.mkdir()
    root = disks.RootDisk(vm / "root.img", vm / "vmlinuz", vm / "initrd.img", "")
    monkeypatch.setattr(facts, "root_disk", lambda _stack: root)
    monkeypatch.setattr(facts, "planned_root_disk", lambda _stack: root)
    req = RunRequest(catalog.load().get("cpu"), False, ("true",), timeout_s=60.0)
    linux = get("linux")
    dry = dict(linux.plan_run(req))
    assert dry["user"] is not None and dry["user"]["name"] == "krun-guest" and not dry["inherit_env"]
    assert "krun-guest" not in (tree / "etc/passwd").read_text()  # the dry run added no user
    out = tmp_path / "out"
    with out.open("wb") as sink:
        result = linux.run(req, RunIO(out=sink))
    assert result.exit_status == 0
    got = received(out.read_bytes().decode(errors="replace"))
    assert_received_is_planned(dry, got, the_run_dir(empty_cache))
    assert got["pid"] == result.pid  # unshare, sh, chroot and env exec'd: QEMU is the process provision started
    assert got["root"] == TREE_MARK and got["cwd"] == "/" and got["uid"] != 0


def files_under(top: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``top`` with its size and modification time."""
    return {str(p.relative_to(top)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in top.rglob("*") if p.is_file() or p.is_symlink()}  # fmt: skip


def with_read_only(folder: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`provision ARGV` in a mount namespace of its own where ``folder`` is read-only (for it alone)."""
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "ro", str(folder)]
    return subprocess.run([*wrapper, sys.executable, "-m", "provision", *argv], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.root
@pytest.mark.usefixtures("refused_network")
@pytest.mark.parametrize("model", ["llama-kquant", "smollm2-135m-instruct-q2_k"])  # synthesized; downloaded
def test_a_dry_run_writes_nothing_and_fetches_nothing(stand_in: Path, empty_cache: Path, model: str) -> None:
    """The model store is mounted read-only and there is no network: a dry run still plans the run
    (the model where the store will put it), and no file under the cache appears or changes."""
    store = empty_cache / "models"
    store.mkdir()
    before = files_under(empty_cache)
    argv = ["run", "llama-linux", "--gpu", "--model", model, "--dry-run", "--json", "--", "true"]
    proc = with_read_only(store, argv)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["data"]
    pin = json.loads((Path(catalog.__file__).parent.parent / "data" / "pins.json").read_text())["models"][model]
    assert plan["model"] == f"{store}/blobs/sha256-{pin['sha256']}"  # where the run will find it
    assert files_under(empty_cache) == before  # no model, no disk, no run directory, no record
    # The same command that may write does: the store refuses it, so the check above could fail.
    wrote = with_read_only(store, [a for a in argv if a != "--dry-run"])
    assert wrote.returncode != 0 and "Traceback" not in wrote.stderr
    assert "E0" in wrote.stderr and "fix:" in wrote.stderr and str(store) in wrote.stderr, wrote.stderr


def test_a_dry_run_names_the_vm_disk_already_made_for_the_image(tmp_path: Path) -> None:
    """A disk made for the stack's image and this guest init is the one the run will boot, so the plan
    names its files (kernel and initrd named by their version) instead of a made-at-run-time path."""
    import hashlib

    from provision.images import disks

    init = hashlib.sha256(disks.init_script()).hexdigest()[:12]
    for key, ref in ((f"aaaa-{init}", "localhost/krun-gpu/cpu:1"), (f"bbbb-{init}", "localhost/krun-gpu/cpu:2"),
                     ("cccc-0123456789ab", "localhost/krun-gpu/cpu:1")):  # fmt: skip
        (tmp_path / key).mkdir()
        (tmp_path / key / "disk.json").write_text(json.dumps(
            {"image": ref, "image_id": f"sha256:{key}", "kernel": "vmlinuz-7", "initrd": "initrd.img-7"}))
    found = disks.made_disk(tmp_path, "localhost/krun-gpu/cpu:1")
    assert found == disks.RootDisk(tmp_path / f"aaaa-{init}" / "root.img", tmp_path / f"aaaa-{init}" / "vmlinuz-7",
                                   tmp_path / f"aaaa-{init}" / "initrd.img-7", f"sha256:aaaa-{init}")  # fmt: skip
    assert disks.made_disk(tmp_path, "localhost/krun-gpu/cpu:3") is None  # another image: made at run time
    assert disks.made_disk(tmp_path / "none", "localhost/krun-gpu/cpu:1") is None
