"""Guest checks and the macOS end-to-end verdicts, on recorded real outputs (tests/data/macos)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision.core import pins
from provision.hosts.darwin import e2e as e2e_macos
from provision.hosts.darwin import guest_checks as dg
from tests.hosts.darwin.macos_fixtures import DATA

VULKANINFO = (DATA / "vulkaninfo-venus-on-llvmpipe.txt").read_text()
PINNED = pins.load().fedora["mesa_vulkan_drivers"]


def test_vulkaninfo_summary_of_a_real_venus_guest():
    devices = dg.parse_vulkaninfo_summary(VULKANINFO)
    assert len(devices) == 1 and devices[0].venus
    assert devices[0].name == "Virtio-GPU Venus (llvmpipe (LLVM 22.1.8, 256 bits))"
    c = dg.check_vulkaninfo(VULKANINFO)
    assert c.status == "warn" and "CPU Vulkan" in c.evidence  # Venus, but the host had no GPU
    on_mac = VULKANINFO.replace("llvmpipe (LLVM 22.1.8, 256 bits)", "Apple M1 Pro").replace(
        "PHYSICAL_DEVICE_TYPE_CPU", "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU"
    )
    assert dg.check_vulkaninfo(on_mac).status == "ok"


def test_only_llvmpipe_means_venus_did_not_load():
    # The same summary as a guest without Venus prints it: the software device alone.
    lavapipe = VULKANINFO.replace(
        "Virtio-GPU Venus (llvmpipe (LLVM 22.1.8, 256 bits))", "llvmpipe (LLVM 22.1.8, 256 bits)"
    )
    lavapipe = lavapipe.replace("DRIVER_ID_MESA_VENUS", "DRIVER_ID_MESA_LLVMPIPE").replace("= venus", "= llvmpipe")
    c = dg.check_vulkaninfo(lavapipe)
    assert c.status == "fail" and c.evidence.startswith("only llvmpipe")
    assert dg.check_vulkaninfo("ERROR: [Loader Message] vkCreateInstance: Found no drivers!\n").status == "fail"


def test_sixteen_kib_failure_is_recognised():
    text = (DATA / "krun-16k-failure.txt").read_text()
    c = dg.check_host_memory_errors(text)
    assert c.status == "fail" and "MemoryMap" in c.evidence and "COPR" in (c.fix or "")
    v = dg.check_vulkaninfo("vkCreateInstance failed with ERROR_OUT_OF_HOST_MEMORY\n")
    assert v.status == "fail" and "16 KiB" in (v.fix or "")
    assert dg.check_host_memory_errors(VULKANINFO).status == "ok"


def test_copr_mesa_and_dev_dri():
    assert dg.check_copr_mesa(f"{PINNED}.aarch64\n", PINNED).status == "ok"
    stock = dg.check_copr_mesa("mesa-vulkan-drivers-25.3.6-1.fc43.aarch64\n", PINNED)
    assert stock.status == "fail" and "not the pinned COPR build" in stock.evidence
    assert dg.check_copr_mesa("package mesa-vulkan-drivers is not installed\n", PINNED).status == "fail"
    assert dg.check_dev_dri("card0\nrenderD128\n").status == "ok"
    assert dg.check_dev_dri("ls: cannot access '/dev/dri': No such file or directory").status == "fail"


def test_one_guest_script_output_split_into_checks():
    out = "\n".join(
        [
            f"{dg.MARK}dri",
            "card0",
            "renderD128",
            f"{dg.MARK}rpm",
            f"{PINNED}.aarch64",
            f"{dg.MARK}vulkaninfo",
            VULKANINFO,
            f"{dg.MARK}end",
        ]
    )
    checks = dg.guest_checks(out, PINNED, copr_expected=True)
    assert [c.id for c in checks] == ["guest.dev-dri", "guest.vulkan", "guest.mesa", "guest.16k-alignment"]
    assert [c.status for c in checks] == ["ok", "warn", "ok", "ok"]
    cut = dg.guest_checks(f"{dg.MARK}dri\nError: crun: cannot open /dev/dri", PINNED, copr_expected=True)
    assert cut[0].id == "guest.run" and cut[0].status == "fail"


def test_llama_bench_tables_parse():
    rows = e2e_macos.parse_llama_bench((DATA / "llama-bench-venus-tcg.txt").read_text())
    assert [(r.backend, r.dev, r.test, r.tps) for r in rows] == [
        ("Vulkan", "Vulkan0", "pp16", 939.93),
        ("Vulkan", "Vulkan0", "tg8", 176.91),
    ]
    apir = e2e_macos.parse_llama_bench((DATA / "llama-bench-virtgpu.txt").read_text())
    assert [(r.backend, r.test, r.tps) for r in apir] == [
        ("ggml-virtgpu", "pp512", 991.30),
        ("ggml-virtgpu", "tg128", 85.71),
    ]


def _cpu_run(gpu_table: str, pp: str) -> str:
    # The CPU run has the same table; only ngl/dev/t/s differ.
    return gpu_table.replace("|  99 | Vulkan0      |", "|   0 | none         |").replace("939.93 ± 0.00", pp)


def test_venus_verdict_needs_an_apple_venus_device_and_2x_pp():
    bench = (DATA / "llama-bench-venus-tcg.txt").read_text()
    mac = VULKANINFO.replace("llvmpipe (LLVM 22.1.8, 256 bits)", "Apple M1 Pro")
    good = e2e_macos.venus_checks(mac, bench, _cpu_run(bench, "200.00 ± 1.00"))
    assert [c.status for c in good] == ["ok", "ok"] and "4.70x" in good[1].evidence
    slow = e2e_macos.venus_checks(mac, bench, _cpu_run(bench, "500.00 ± 1.00"))
    assert slow[1].status == "fail"
    not_apple = e2e_macos.venus_checks(VULKANINFO, bench, _cpu_run(bench, "200.00 ± 1.00"))
    assert not_apple[0].status == "fail"
    report = e2e_macos.report("venus", good, "podman: podman version 6.0.2\n")
    assert report.startswith("### krun-gpu macOS venus check: PASS") and "| ok | venus.speedup |" in report


REPORT = Path(__file__).resolve().parents[3] / "checks" / "macos-report"


def test_apir_verdict_needs_the_ggml_virtgpu_backend():
    assert e2e_macos.apir_checks((DATA / "llama-bench-virtgpu.txt").read_text())[0].status == "ok"
    vulkan = e2e_macos.apir_checks((DATA / "llama-bench-venus-tcg.txt").read_text())
    assert vulkan[0].status == "fail" and "Vulkan" in vulkan[0].evidence


def test_two_guest_processes_at_once_must_both_run_on_ggml_virtgpu():
    bench = (DATA / "llama-bench-virtgpu.txt").read_text()
    both = e2e_macos.apir_together_check(f"== first (exit 0)\n{bench}== second (exit 0)\n{bench}")
    assert both.status == "ok" and both.evidence.count(" t/s") == 2, both
    # what a krunkit without 0020 gives the second: refused at load, no table, llama-bench's exit status
    refused = ("ggml-virtgpu: virtgpu_load_library: failed to load the library: the APIR backend library "
               "initialization failed\nmain: error: failed to load model\n")
    second = e2e_macos.apir_together_check(f"== first (exit 0)\n{bench}== second (exit 1)\n{refused}")
    assert second.status == "fail" and "second" in second.evidence and "0020" in (second.fix or ""), second
    # the first ran on the CPU (a table, not ggml-virtgpu's): no silent fallback passes
    cpu = (DATA / "llama-bench-venus-tcg.txt").read_text()
    first = e2e_macos.apir_together_check(f"== first (exit 0)\n{cpu}== second (exit 0)\n{bench}")
    assert first.status == "fail" and "first" in first.evidence, first
    assert e2e_macos.apir_together_check(bench).status == "fail"  # not the two-process output at all


def test_the_macos_report_script_prints_the_verdict_of_the_saved_outputs(tmp_path: Path) -> None:
    def report(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(REPORT), *args], capture_output=True, text=True, timeout=60)

    good = report("apir", "--bench", str(DATA / "llama-bench-virtgpu.txt"))
    assert good.returncode == 0 and "PASS" in good.stdout
    vulkan = report("apir", "--bench", str(DATA / "llama-bench-venus-tcg.txt"))
    assert vulkan.returncode == 1 and "FAIL" in vulkan.stdout
    assert report("venus").returncode == 2  # argparse: the saved files are required
    bench = (DATA / "llama-bench-virtgpu.txt").read_text()
    together = tmp_path / "together.txt"
    together.write_text(f"== first (exit 0)\n{bench}== second (exit 1)\nno table\n")
    two = report("apir", "--bench", str(DATA / "llama-bench-virtgpu.txt"), "--together", str(together))
    assert two.returncode == 1 and "| fail | apir.two-processes |" in two.stdout, two.stdout
