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
from provision.hosts.linux import accel
from provision.hosts.linux import doctor as dl

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux route's checks")


def _doctor(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["doctor", *args])
    return code, capsys.readouterr().out


def test_doctor_reports_this_machine_truthfully(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(dl.HOST_TOOLS_ENV, raising=False)
    # An empty cache: no chroot from `provision host-tools`, so only this host's own tools count.
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path))
    code, out = _doctor(capsys, "--json")
    report = json.loads(out)
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
    assert list(data) == sorted(data) and all(list(c) == sorted(c) for c in data["checks"])
    code, table = _doctor(capsys)
    assert "linux.qemu" in table.splitlines()[2] and table.splitlines()[0].split()[:2] == ["STATUS", "CHECK"]


def test_exit_status_is_0_when_all_pass_and_1_when_one_fails(capsys, monkeypatch):
    providers = {"linux": [lambda ctx: [Check("a", "ok", "fine"), Check("b", "warn", "meh", "x")]], "*": []}
    monkeypatch.setattr(doctor, "CHECK_PROVIDERS", providers)
    assert _doctor(capsys)[0] == 0
    doctor.register("*", lambda ctx: [Check("apir.x", "fail", "broken", "fix it")])
    code, out = _doctor(capsys, "--json")
    assert code == 1 and json.loads(out)["ok"] is False
    assert [c["id"] for c in json.loads(out)["checks"]] == ["a", "b", "apir.x"]


def test_tools_are_found_in_the_host_tools_chroot(tmp_path, monkeypatch):
    root = tmp_path / "sid"
    for rel in ("usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1", "usr/libexec/virgl_render_server", "usr/bin/tool"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    mesa = root / "usr/share/glvnd/egl_vendor.d/50_mesa.json"
    mesa.parent.mkdir(parents=True)
    mesa.write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_mesa.so.0"}}')
    env = {"PATH": "/nonexistent", dl.HOST_TOOLS_ENV: str(root)}
    tool = dl.find_program("tool", env)
    assert tool is not None and tool.root == root and tool.argv("-h") == ["chroot", str(root), "/usr/bin/tool", "-h"]
    assert (
        dl.find_file("libvirglrenderer.so.1", dl.LIB_DIRS, env)
        == root / "usr/lib/x86_64-linux-gnu/libvirglrenderer.so.1"
    )
    checks = dl.check_virglrenderer(
        dl.find_file("libvirglrenderer.so.1", dl.LIB_DIRS, env),
        dl.find_file("virgl_render_server", dl.RENDER_SERVER_DIRS, env),
    )
    assert [c.status for c in checks] == ["ok", "ok"] and str(root) in checks[1].evidence
    shown = dl.check_display([], dl.display.egl_vendors(root, env))
    assert shown.status == "ok" and "offscreen" in shown.evidence and str(mesa) in shown.evidence
    assert "Mesa" in shown.evidence and "libEGL_mesa.so.0" in shown.evidence
    assert dl.check_display([], []).status == "fail" and "__EGL_VENDOR_LIBRARY_FILENAMES" in str(
        dl.check_display([], []).fix
    )
    assert dl.check_display(["/dev/dri/renderD128"], []).evidence.endswith("egl-headless")
    assert dl.find_program("qemu-system-x86_64", env) is None
    qemu = dl.check_qemu(None, None)
    assert qemu[0].status == "fail" and dl.HOST_TOOLS_ENV in qemu[0].evidence


# QEMU's `-device virtio-gpu-gl-pci,help` format (property=<type>  -  description).
QEMU_HELP = """virtio-gpu-gl-pci options:
  acpi-index=<uint32>    -  (default: 0)
  blob=<bool>            -  on/off (default: false)
  context_init=<bool>    -  on/off (default: true)
  hostmem=<size>         -  Size in bytes, ... (default: 0)
  max_outputs=<uint32>   -  (default: 1)
  venus=<bool>           -  on/off (default: false)
"""


def test_qemu_device_help_parsing():
    tool = dl.Tool(Path("/usr/bin/qemu-system-x86_64"), None)
    assert {"venus", "blob", "hostmem"} <= qemu.parse_device_help(QEMU_HELP)
    assert dl.check_qemu(tool, (0, QEMU_HELP))[1].status == "ok"
    old = QEMU_HELP.replace("  venus=<bool>           -  on/off (default: false)\n", "")
    assert "venus" in dl.check_qemu(tool, (0, old))[1].evidence
    missing = dl.check_qemu(
        tool,
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
