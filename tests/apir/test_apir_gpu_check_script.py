"""checks/apir-gpu with the CPU backend: the same report fields the GPU run commits in bench/results/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision.adapters import apir as adapter

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_apir_gpu_check_script_reports_device_buffer_and_dispatch_timings_on_cpu(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "checks" / "apir-gpu"), "--cpu", "--out", str(tmp_path),
                           "--repeat", "20", "--alloc-mib", "8", "--bench-alloc-mib", "1", "--jobs", "2"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert "error" not in report
    assert report["environment"]["cpus"] and report["environment"]["cmake"]
    assert report["build"]["manifest"]["variant"] == "host"
    check = report["check"]
    assert check["code"] == 6 and check["code_name"] == "SUCCESS"
    dev = check["device"]
    assert dev["name"] == "CPU" and dev["description"] and dev["memory_total"] >= dev["memory_free"] > 0
    buf = check["buffer"]
    assert buf["size"] == 8 << 20 and buf["allocated"] and buf["cleared"] and buf["freed"]
    for step in ("alloc_ms", "clear_ms", "free_ms"):
        assert buf[step] >= 0
    assert check["timings_ms"]["initialize"] > 0 and check["timings_ms"]["cmd.device_get_memory"] >= 0
    rows = {r["command"]: r for r in report["bench"]["rows"]}
    assert set(rows) == set(adapter.CMD)
    cycles = {"buffer_type_alloc_buffer", "buffer_get_base", "buffer_clear", "buffer_free_buffer"}
    for name, r in rows.items():
        assert r["n"] == (5 if name in cycles else 20), r  # buffer cycles: repeat/10, at least 5
        assert 0 < r["min_us"] <= r["median_us"] <= r["p95_us"], r
    assert rows["buffer_clear"]["bytes"] == 1 << 20 and rows["device_get_name"]["bytes"] is None
    md = (tmp_path / "report.md").read_text()
    assert "## apir check" in md and "## Dispatcher round trips" in md and "buffer_type_alloc_buffer" in md
