"""Linux route pieces that need no VM: QEMU command lines, accelerator choice, job scripts,
GPU slots, bench parsing and gate, and the errors a run raises before any VM starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.adapters import qemu
from provision.adapters.chroot import Chroot
from provision.bench import report as bench
from provision.core import catalog, settings
from provision.core.errors import BenchGateFailed, GpuSlotTimeout
from provision.hosts.linux.run import accel, slots
from provision.hosts.linux.run import runplan as linux
from provision.images import disks as vmdisk
from tests.helpers import run_provision

PVM_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep avx2 bmi2 hypervisor\n"
VMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu vme vmx avx2 bmi2\n"


def _spec(gpu: bool) -> qemu.VmSpec:
    return qemu.VmSpec(
        kernel="/vm/vmlinuz",
        initrd="/vm/initrd",
        root=qemu.Drive("/vm/root.img", "krun-root"),
        drives=(qemu.Drive("/run/job.img", "krun-job"),),
        console_log="/run/console.log",
        stdout_log="/run/stdout.log",
        stderr_log="/run/stderr.log",
        gpu=gpu,
        display="sdl" if gpu else "none",
        memory_mib=4096,
        hostmem_mib=2048,
    )


def test_gpu_command_line_has_venus_blob_hostmem_and_shared_memfd() -> None:
    argv = qemu.argv(_spec(gpu=True))
    line = " ".join(argv)
    assert "virtio-gpu-gl-pci,venus=on,blob=on,hostmem=2048M" in line
    assert "memory-backend-memfd,id=mem,size=4096M,share=on" in line
    assert argv[argv.index("-display") + 1] == "sdl,gl=on"
    assert "file=/vm/root.img,format=raw,if=none,id=d0,readonly=on" in line
    assert " ro " in " " + argv[argv.index("-append") + 1] + " "


def test_cpu_command_line_has_no_gpu_device_and_no_display() -> None:
    argv = qemu.argv(_spec(gpu=False))
    assert not any("virtio-gpu" in a for a in argv)
    assert argv[argv.index("-display") + 1] == "none"
    # three serial ports: console, the command's stdout, its stderr
    assert argv.count("-serial") == 3


def test_pvm_kvm_means_tcg_and_real_vmx_means_kvm() -> None:
    assert accel.decide(True, True, PVM_CPUINFO).accel == "tcg"
    assert accel.decide(True, True, VMX_CPUINFO).accel == "kvm"
    assert accel.decide(True, False, VMX_CPUINFO).accel == "tcg"
    assert accel.decide(False, False, VMX_CPUINFO).accel == "tcg"
    assert qemu.argv(qemu.VmSpec(**{**_spec(False).__dict__, "accel": "kvm"}))[1:5] == ["-accel", "kvm", "-cpu", "host"]


def _host(tmp_path: Path, cpuinfo: str, kvm: bool, pvm: bool = False) -> Path:
    """A host laid out as accel reads one: /proc/cpuinfo, /dev/kvm, /sys/module/kvm_pvm."""
    (tmp_path / "proc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "proc/cpuinfo").write_text(cpuinfo)
    if kvm:
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev/kvm").write_text("")
    if pvm:
        (tmp_path / "sys/module/kvm_pvm").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(
    ("cpuinfo", "kvm", "pvm", "expected"),
    [
        (PVM_CPUINFO, True, True, "tcg"),  # a paravirtual /dev/kvm: no vmx/svm flags
        (PVM_CPUINFO, True, False, "tcg"),
        (VMX_CPUINFO, False, False, "tcg"),  # no /dev/kvm at all
        (VMX_CPUINFO, True, False, "kvm"),
    ],
)
def test_this_host_gets_tcg_when_its_cpu_has_no_vmx(tmp_path: Path, cpuinfo: str, kvm: bool, pvm: bool,
                                                    expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _host(tmp_path, cpuinfo, kvm, pvm)
    monkeypatch.delenv("PROVISION_ACCEL", raising=False)
    assert accel.for_run(root=root).accel == expected
    # The setting accel is what the run uses, on any host; kvm without /dev/kvm is a failing check.
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    assert accel.for_run(root=root).accel == "tcg"
    forced = accel.for_run(settings.load({"PROVISION_ACCEL": "kvm"}, system=root / "none", user=root / "none"),
                           root=root)  # fmt: skip
    assert forced.accel == "kvm" and forced.status == ("ok" if kvm else "fail")
    assert forced.evidence.startswith("PROVISION_ACCEL=kvm") and (kvm or "unset PROVISION_ACCEL" in str(forced.fix))


def test_device_help_parsing_finds_properties() -> None:
    text = (
        "virtio-gpu-gl-pci options:\n  blob=<bool>            -  (default: false)\n"
        "  hostmem=<size>         -  (default: 0)\n  venus=<bool>           -  (default: false)\n"
    )
    assert {"blob", "hostmem", "venus"} <= qemu.parse_device_help(text)
    assert qemu.parse_display_help("Available display backend types:\nnone\nsdl\negl-headless\n") == {
        "none",
        "sdl",
        "egl-headless",
    }


def test_job_script_sets_guest_env_and_quotes_the_command() -> None:
    stack = catalog.load().get("llama-linux")
    script = linux.job_script(stack, ["echo", "a b", "$HOME;x"], "tiny.gguf", gpu=True)
    env_only = script.rsplit("\n", 2)[0] + "\nenv\n"
    out = subprocess.run(["sh", "-c", env_only], capture_output=True, text=True)
    assert "VK_DRIVER_FILES=/usr/share/vulkan/icd.d/virtio_icd.json" in out.stdout
    assert "GGML_VK_VISIBLE_DEVICES=0" in out.stdout
    assert "MODEL=/models/tiny.gguf" in out.stdout
    plain = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
    assert plain.stdout == "a b $HOME;x\n"


def test_job_disk_is_whole_sectors_and_round_trips(tmp_path: Path) -> None:
    disk = vmdisk.write_job_disk("echo hi\n", tmp_path / "job.img")
    data = disk.read_bytes()
    assert len(data) % vmdisk.SECTOR == 0
    assert data.rstrip(b"\0") == b"echo hi\n"


def test_chroot_argv_binds_and_translates_paths(tmp_path: Path) -> None:
    ch = Chroot(Path("/srv/tools")).with_binds({tmp_path: "/mnt/krun/run"})
    assert ch.inside(tmp_path / "x.log") == "/mnt/krun/run/x.log"
    with pytest.raises(ValueError):
        ch.inside(Path("/etc/passwd"))
    argv = ch.argv(["qemu-system-x86_64", "-version"], {"DISPLAY": ":3"})
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert "DISPLAY=:3" in argv and argv[-2:] == ["qemu-system-x86_64", "-version"]


def test_third_gpu_slot_waits_until_deadline_then_e022(tmp_path: Path) -> None:
    a = slots.try_acquire(2, tmp_path)
    b = slots.try_acquire(2, tmp_path)
    assert a and b and a.index != b.index
    assert slots.try_acquire(2, tmp_path) is None
    start = time.monotonic()
    with pytest.raises(GpuSlotTimeout):
        slots.acquire(time.monotonic() + 1.0, 2, tmp_path)
    assert 0.9 <= time.monotonic() - start < 3
    a.release()
    c = slots.acquire(time.monotonic() + 1.0, 2, tmp_path)
    assert c.index == a.index
    b.release()
    c.release()


def test_slot_held_by_another_process_counts_and_frees_when_it_dies(tmp_path: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from provision.hosts.linux.run import slots; "
        f"s = slots.try_acquire(1, Path({str(tmp_path)!r})); print(s.index, flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        assert slots.try_acquire(1, tmp_path) is None
    finally:
        holder.kill()
        holder.wait()
    slot = slots.acquire(time.monotonic() + 2, 1, tmp_path)
    slot.release()


SAMPLE_BENCH = [
    {"n_prompt": 256, "n_gen": 0, "avg_ts": 900.0, "stddev_ts": 10.0, "backends": "Vulkan", "devices": "Vulkan0"},
    {"n_prompt": 0, "n_gen": 16, "avg_ts": 150.0, "stddev_ts": 5.0, "backends": "Vulkan", "devices": "Vulkan0"},
]


def _results(gpu_pp: float, cpu_pp: float) -> list[bench.BenchResult]:
    text = "log line\n" + json.dumps(SAMPLE_BENCH)
    gpu = bench.parse_llama_bench("guest-gpu", "@@x\n" + text)
    gpu = [
        bench.BenchResult(
            r.where, r.test, gpu_pp if r.test.startswith("pp") else r.tokens_per_s, r.stddev, r.backend, r.device
        )
        for r in gpu
    ]
    cpu = [bench.BenchResult("guest-cpu", "pp256", cpu_pp, 1.0, "CPU", "CPU")]
    return gpu + cpu


def test_bench_parsing_sections_and_gate(tmp_path: Path) -> None:
    out = "@@krun-bench guest-gpu\n[1]\n@@krun-bench guest-cpu\n[2]\n"
    assert bench.split_sections(out) == {"guest-gpu": "\n[1]\n", "guest-cpu": "\n[2]\n"}
    res = _results(900.0, 300.0)
    assert [r.test for r in res] == ["pp256", "tg16", "pp256"]
    g = bench.gate(res)
    assert g.holds and g.factor == pytest.approx(3.0)
    bench.check_gate(g)
    weak = bench.gate(_results(500.0, 300.0))
    assert not weak.holds
    with pytest.raises(BenchGateFailed):
        bench.check_gate(weak)
    host = [bench.BenchResult("host-native", "pp256", 1800.0, 0, "Vulkan", "llvmpipe")]
    assert bench.remoting_ratios(res + host) == {"pp256": pytest.approx(0.5)}
    png = bench.plot(res + host, "t", tmp_path / "b.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"



def test_gpu_on_a_stack_without_gpu_is_e007_before_any_vm(tmp_path: Path) -> None:
    proc = run_provision("run", "cpu", "--gpu", "--", "true", env={"PROVISION_CACHE": str(tmp_path)})
    assert proc.returncode == 17, proc.stderr
    assert "E007" in proc.stderr and "cpu" in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "vm-disks").exists()


def test_missing_host_tools_is_e020_naming_what_and_how(tmp_path: Path) -> None:
    empty = tmp_path / "tools"
    empty.mkdir()
    proc = run_provision(
        "run",
        "llama-linux",
        "--gpu",
        "--",
        "true",
        env={"PROVISION_HOST_TOOLS": str(empty), "PROVISION_CACHE": str(tmp_path)},
    )
    assert proc.returncode == 30, proc.stderr
    assert "E020" in proc.stderr
    for what in ("qemu-system-x86_64", "virgl_render_server", "libEGL.so.1", "libvirglrenderer"):
        assert what in proc.stderr
    assert "fix:" in proc.stderr and "PROVISION_HOST_TOOLS" in proc.stderr
    check = run_provision("host-tools", "--check", "--json", env={"PROVISION_HOST_TOOLS": str(empty)})
    assert check.returncode == 1
    failing = {c["id"] for c in json.loads(check.stdout)["data"]["checks"] if c["status"] == "fail"}
    assert {"host-tools.qemu", "host-tools.render-server", "host-tools.egl", "host-tools.virglrenderer"} <= failing


def test_apir_run_without_the_apir_host_build_names_it_before_any_vm(tmp_path: Path) -> None:
    proc = run_provision("run", "llama-apir-linux", "--gpu", "--", "true", env={"PROVISION_CACHE": str(tmp_path)})
    assert proc.returncode == 30, proc.stderr
    assert "E020" in proc.stderr and "provision host-tools --apir" in proc.stderr and "--virgl-src" in proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.root
def test_host_tools_apir_without_a_reachable_tree_names_the_rev_and_virgl_src(
    tmp_path: Path, refused_network: None
) -> None:
    proc = run_provision("host-tools", "--apir", env={"PROVISION_CACHE": str(tmp_path)})
    assert proc.returncode == 52, proc.stderr
    from provision.core import pins

    assert "E042" in proc.stderr and pins.default().source("virglrenderer-apir")["rev"] in proc.stderr
    assert "--virgl-src" in proc.stderr
    assert not list(tmp_path.glob("host-tools/*"))  # nothing was built first


def test_host_tools_steps_stream_their_output_and_name_a_failure() -> None:
    from provision.core import errors
    from provision.hosts.linux.tools import host_tools

    seen: list[str] = []
    host_tools._run(["sh", "-c", "echo one; echo two"], seen.append)
    assert seen[1:] == ["one", "two"]
    with pytest.raises(errors.HostToolsMissing) as exc:
        host_tools._run(["sh", "-c", "echo building; exit 3"], seen.append)
    assert "exited 3" in exc.value.message and "building" in exc.value.message


def test_an_apir_run_leaves_no_apir_environment_for_the_next_venus_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `provision bench llama-apir-linux` runs the APIR guest, then the Venus guest in one process:
    # VIRGL_ROUTE_VENUS_TO_APIR carried over would route the Venus guest to APIR (no Vulkan0).
    import dataclasses

    from provision.hosts import RunRequest
    from provision.hosts.linux.apir import host_side
    from provision.hosts.linux.run import facts as linux_facts
    from provision.hosts.linux.tools import host_tools

    (tmp_path / host_side.STAMP).write_text("{}")
    tools = host_tools.HostTools(tmp_path, "cache")
    monkeypatch.setattr(linux_facts, "_tools", lambda _stack, _gpu: tools)
    cat = catalog.load()
    apir_req = RunRequest(cat.get("llama-apir-linux"), True, ("true",))
    apir = linux_facts.gather(apir_req, dry_run=True)
    venus = linux_facts.gather(RunRequest(cat.get("llama-linux"), True, ("true",)), dry_run=True)
    assert apir.route_env["VIRGL_ROUTE_VENUS_TO_APIR"] == "1" and apir.watch_workers
    assert "VIRGL_ROUTE_VENUS_TO_APIR" not in venus.route_env and not venus.watch_workers
    # Nothing to set between runs: the request and the plan are frozen, and a plan is all a run reads.
    plan = linux.plan_run(apir_req, apir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        apir_req.gpu = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.env = ()  # type: ignore[misc]
    assert dict(plan.env)["VIRGL_ROUTE_VENUS_TO_APIR"] == "1"


@pytest.mark.root
def test_the_refused_network_fixture_reaches_nothing_not_even_a_listener_on_this_host(request) -> None:
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # reachable from the host's namespace
    request.getfixturevalue("refused_network")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    probe = subprocess.run([sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)"],
                           capture_output=True, text=True)
    assert probe.returncode != 0  # the programs the test starts are cut off too
    listener.close()
