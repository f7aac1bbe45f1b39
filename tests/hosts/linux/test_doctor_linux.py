"""`provision doctor` on this Linux machine: truthful about the Linux route's host tools,
exit 0/1 semantics, stable --json, tools found in the PROVISION_HOST_TOOLS chroot."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.adapters import qemu
from provision.core.diagnostics import Check
from provision.doctor import checks as doctor
from provision.hosts.linux import doctor as dl
from provision.hosts.linux.run import accel
from provision.hosts.linux.tools import host_tools
from tests.helpers import run_provision

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux route's checks")


def _doctor(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["doctor", *args])
    return code, capsys.readouterr().out


def test_doctor_reports_this_machine_truthfully(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(dl.HOST_TOOLS_ENV, raising=False)
    # An empty cache: no chroot from `provision host-tools`, so only this host's own tools count.
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path))
    code, out = _doctor(capsys, "--json")
    report = json.loads(out)["data"]
    by_id = {c["id"]: c for c in report["checks"]}
    assert report["platform"] == "linux"
    assert set(by_id) == {
        "linux.qemu",
        "linux.virglrenderer",
        "linux.virgl-render-server",
        "linux.display",
        "linux.accel",
    } | ({"linux.qemu.virtio-gpu-gl"} if shutil.which(dl.QEMU) else set()) | {
        "apir.backend",
        "apir.protocol",
        "linux.apir.route",  # the test's cache is empty: the Linux APIR route is not set up
        "route.auto",  # the route `run --gpu` without a stack would take
    } | {f"linux.isolation.{k}" for k in ("sandbox", "network", "mounts", "limits", "user")}
    # No tools chroot in this cache: a root provision could not drop privileges, and says so.
    assert by_id["linux.isolation.user"]["status"] == ("warn" if os.geteuid() == 0 else "ok")
    assert by_id["linux.apir.route"]["status"] == "skip"
    # The APIR checks run on every platform: skipped unless the hypervisor's APIR env is set.
    if not os.environ.get("VIRGL_APIR_BACKEND_LIBRARY"):
        assert by_id["apir.backend"]["status"] == "skip"
    assert by_id["apir.protocol"]["status"] in ("ok", "warn")
    # Facts read independently of the doctor's code:
    assert (by_id["linux.qemu"]["status"] == "ok") == (shutil.which(dl.QEMU) is not None)
    has_lib = any(
        Path(d, "libvirglrenderer.so.1").exists() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")
    )
    assert (by_id["linux.virglrenderer"]["status"] == "ok") == has_lib
    nodes = list(Path("/dev/dri").glob("renderD*")) if Path("/dev/dri").is_dir() else []
    vendor_dirs = [Path("/etc/glvnd/egl_vendor.d"), Path("/usr/share/glvnd/egl_vendor.d")]
    vendors = [m for d in vendor_dirs if d.is_dir() for m in d.glob("*.json")]
    assert (by_id["linux.display"]["status"] == "ok") == bool(nodes or vendors or dl.chroot_root(dict(os.environ)))
    assert "Xvfb" not in by_id["linux.display"]["evidence"]
    flags = Path("/proc/cpuinfo").read_text()
    hw = " vmx" in flags or " svm" in flags
    accel = by_id["linux.accel"]
    if not Path("/dev/kvm").exists():
        assert "TCG" in accel["evidence"]
    elif hw:
        assert accel["status"] == "ok" and "KVM" in accel["evidence"]
    elif Path("/sys/module/kvm_pvm").exists():
        assert accel["status"] == "warn" and "PVM" in accel["evidence"]
    for c in report["checks"]:
        assert c["evidence"] and (c["status"] in ("ok", "skip") or c["fix"] is not None or c["status"] == "warn")
    assert report["ok"] == (code == 0) == all(c["status"] != "fail" for c in report["checks"])


def test_json_is_stable_and_sorted(capsys):
    _, first = _doctor(capsys, "--json")
    _, second = _doctor(capsys, "--json")
    assert first == second
    data = json.loads(first)
    assert list(data) == sorted(data) and list(data["data"]) == sorted(data["data"])
    assert all(list(c) == sorted(c) for c in data["data"]["checks"])
    code, table = _doctor(capsys)
    assert "linux.qemu" in table.splitlines()[2] and table.splitlines()[0].split()[:2] == ["STATUS", "CHECK"]


def test_exit_status_is_0_when_all_pass_and_1_when_one_fails(capsys, monkeypatch):
    from provision.hosts.linux.host import LinuxHost

    checks = [Check("a", "ok", "fine"), Check("b", "warn", "meh", "x")]
    monkeypatch.setattr(LinuxHost, "doctor_checks", lambda self, ctx: checks)
    monkeypatch.setattr(doctor.apir, "doctor_checks", lambda ctx: [])
    monkeypatch.setattr(doctor, "route_checks", lambda ctx: [])
    assert _doctor(capsys)[0] == 0
    monkeypatch.setattr(doctor.apir, "doctor_checks", lambda ctx: [Check("apir.x", "fail", "broken", "fix it")])
    code, out = _doctor(capsys, "--json")
    shown = json.loads(out)
    assert code == 1 and shown["data"]["ok"] is False and shown["status"] == "fail"
    assert [c["id"] for c in shown["data"]["checks"]] == ["a", "b", "apir.x"]


def test_tools_are_found_in_the_host_tools_chroot(tmp_path, monkeypatch):
    root = tmp_path / "sid"
    for rel in ("usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1", "usr/libexec/virgl_render_server", "usr/bin/tool"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    mesa = root / "usr/share/glvnd/egl_vendor.d/50_mesa.json"
    mesa.parent.mkdir(parents=True)
    mesa.write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_mesa.so.0"}}')
    env = {"PATH": "/nonexistent"}
    monkeypatch.setenv(dl.HOST_TOOLS_ENV, str(root))
    tools = host_tools.locate(env=env)
    assert tools is not None and tools.is_chroot and tools.root == root
    lib = host_tools.find(tools, host_tools.VIRGL_LIB_GLOB, env)
    assert lib == root / "usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1"
    checks = dl.check_virglrenderer(lib, host_tools.find(tools, host_tools.RENDER_SERVER, env))
    assert [c.status for c in checks] == ["ok", "ok"] and str(root) in checks[1].evidence
    shown = dl.check_display([], dl.display.egl_vendors(root, env))
    assert shown.status == "ok" and "offscreen" in shown.evidence and str(mesa) in shown.evidence
    assert "Mesa" in shown.evidence and "libEGL_mesa.so.0" in shown.evidence
    assert dl.check_display([], []).status == "fail" and "__EGL_VENDOR_LIBRARY_FILENAMES" in str(
        dl.check_display([], []).fix
    )
    assert dl.check_display(["/dev/dri/renderD128"], []).evidence.endswith("egl-headless")
    assert host_tools.find(tools, host_tools.QEMU, env) is None
    qemu_checks = dl.check_qemu(tools, None, None)
    assert qemu_checks[0].status == "fail" and str(root) in qemu_checks[0].evidence


# QEMU's `-device virtio-gpu-gl-pci,help` format (property=<type>  -  description).
QEMU_HELP = """virtio-gpu-gl-pci options:
  acpi-index=<uint32>    -  (default: 0)
  blob=<bool>            -  on/off (default: false)
  context_init=<bool>    -  on/off (default: true)
  hostmem=<size>         -  Size in bytes, ... (default: 0)
  max_outputs=<uint32>   -  (default: 1)
  venus=<bool>           -  on/off (default: false)
"""


FAKE_QEMU = """#!/bin/sh
case "$1" in
  --version) echo 'QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2)' ;;
  -display) printf 'Available display backend types:\\nnone\\nsdl\\negl-headless\\n' ;;
  *) cat <<'EOF'
""" + QEMU_HELP + """EOF
  ;;
esac
"""


def _bundle_install(cache: Path) -> Path:
    """An installed `--from` bundle (manifest and all) whose QEMU is a program that answers -device help."""
    from provision.hosts.linux.tools import bundle_archive

    top = bundle_archive.default_install_dir()
    files = {
        host_tools.QEMU: FAKE_QEMU,
        host_tools.RENDER_SERVER: "",
        "usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1": "",
        host_tools.EGL_LOADER: "",
    }
    for rel, text in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(text)
        (top / rel).chmod(0o755)
    (top / bundle_archive.MANIFEST).write_text(
        json.dumps({"format": bundle_archive.FORMAT, "guest": {}, "files": bundle_archive.hashes(top)})
    )
    assert str(top).startswith(str(cache))
    return top


@pytest.mark.parametrize("accel_env", ["tcg", "kvm", None])
def test_doctor_and_run_find_the_same_bundle_and_pick_the_same_accelerator(empty_cache, monkeypatch, accel_env):
    monkeypatch.delenv(dl.HOST_TOOLS_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no QEMU of the host's own in the way
    if accel_env is None:
        monkeypatch.delenv(accel.ENV_OVERRIDE, raising=False)
    else:
        monkeypatch.setenv(accel.ENV_OVERRIDE, accel_env)
    top = _bundle_install(empty_cache)
    report = json.loads(run_provision("doctor", "--json").stdout)["data"]
    by_id = {c["id"]: c for c in report["checks"]}
    # What the run acts on, in the same environment:
    tools = host_tools.locate()
    assert tools is not None and tools.bundle and tools.root == top
    assert by_id["linux.qemu"]["status"] == "ok" and by_id["linux.qemu"]["evidence"].startswith(str(top))
    assert by_id["linux.qemu.virtio-gpu-gl"]["status"] == "ok"  # doctor ran the bundle's QEMU
    assert by_id["linux.virgl-render-server"]["evidence"] == str(top / host_tools.RENDER_SERVER)
    # `provision run --dry-run` prints the plan the run acts on: the same tools, the same accelerator.
    dry = run_provision("run", "llama-linux", "--gpu", "--dry-run", "--", "true")
    assert dry.returncode == 0, dry.stderr
    header, tools_line = dry.stdout.splitlines()[:2]
    assert tools_line.startswith(f"# tools {top} (bundle)")
    run_accel = header.split("accel ")[1].split(",")[0]
    assert f"-accel {'kvm' if run_accel == 'kvm' else 'tcg'}" in dry.stdout
    assert run_accel.upper() in by_id["linux.accel"]["evidence"]
    assert (by_id["linux.accel"]["status"] == "ok") == (run_accel == "kvm")
    if accel_env is not None:
        assert run_accel == accel_env and f"PROVISION_ACCEL={accel_env}" in by_id["linux.accel"]["evidence"]




def test_qemu_device_help_parsing():
    tools = host_tools.HostTools(Path("/"), "host")
    path = Path("/usr/bin/qemu-system-x86_64")
    assert {"venus", "blob", "hostmem"} <= qemu.parse_device_help(QEMU_HELP)
    assert dl.check_qemu(tools, path, (0, QEMU_HELP))[1].status == "ok"
    old = QEMU_HELP.replace("  venus=<bool>           -  on/off (default: false)\n", "")
    assert "venus" in dl.check_qemu(tools, path, (0, old))[1].evidence
    missing = dl.check_qemu(
        tools, path,
        (1, "qemu-system-x86_64: -device virtio-gpu-gl-pci,help: 'virtio-gpu-gl-pci' is not a valid device model name"),
    )
    assert missing[1].status == "fail" and "not a valid device model name" in missing[1].evidence


def test_accel_classification_is_the_run_decision():
    vmx = accel.decide(True, True, "flags\t\t: fpu vme vmx sse")
    assert vmx.check().status == "ok" and vmx.accel == "kvm"
    assert accel.decide(True, True, "flags\t\t: fpu svm").evidence.startswith("/dev/kvm with svm")
    pvm = accel.decide(True, True, "flags\t\t: fpu sse", False, "[    1.0] kvm-pvm: loaded")
    assert pvm.check().status == "warn" and "PVM" in pvm.evidence and pvm.accel == "tcg"
    assert "TCG" in accel.decide(False, False, "").evidence


def test_doctor_context_reads_pins(monkeypatch):
    ctx = doctor.context(platform="linux", env=dict(os.environ))
    assert ctx.compat["krunkit_memory"]["max_ram_mib"] == 61440
    assert ctx.pinned_mesa.startswith("mesa-vulkan-drivers-")
