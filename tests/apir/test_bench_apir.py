"""`provision bench` on the APIR route: the gate and the remoting ratio use the APIR device,
the Venus numbers of the same run get their own ratio, and the markdown table lists all."""

from __future__ import annotations

import pytest

from provision.apir import route as apir_route
from provision.bench import report as bench
from provision.hosts.linux.run import bench as linux_bench


def r(where: str, test: str, ts: float) -> bench.BenchResult:
    return bench.BenchResult(where, test, ts, 1.0, "x", where)


def test_apir_gate_ratio_and_table():
    results = [r("guest-apir", "pp256", 900.0), r("guest-apir", "tg16", 60.0), r("guest-cpu", "pp256", 30.0),
               r("guest-gpu", "pp256", 450.0), r("host-native", "pp256", 1000.0), r("host-native", "tg16", 80.0)]
    g = bench.gate(results, gpu_where="guest-apir")
    assert g.holds and g.factor == pytest.approx(30.0)
    data = bench.report("llama-apir-linux", "m", results, g, {}, gpu_where="guest-apir")
    assert data["remoting_ratio"] == {"pp256": pytest.approx(0.9), "tg16": pytest.approx(0.75)}
    assert data["remoting_ratio_venus"] == {"pp256": pytest.approx(0.45)}
    md = bench.markdown(data)
    assert md.count("\n| guest-") == 4 and "| host-native | tg16 | 80.0 |" in md
    assert "remoting_ratio (over host native): pp256 0.90, tg16 0.75" in md


def test_apir_places_name_the_remote_device_and_the_cpu():
    cmd = linux_bench.guest_bench_command(apir_route.GUEST_BENCH_PLACES)[-1]
    assert "@@krun-bench guest-apir" in cmd and "'[virtgpu] Vulkan0'" in cmd and "-dev none" in cmd
