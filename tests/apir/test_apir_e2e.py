"""The Linux APIR route end to end in the test suite, from the pinned tree in ../shared/upstream/.

It runs checks/linux-apir (the one implementation of the route's check) with the shared
tarball as --virgl-src and judges the results it writes: the guest lists a [virtgpu]
device, llama-bench runs on it through ggml-virtgpu, test-backend-ops runs every op of the
llama graph there with cases counted per op, no host worker dies, greedy text from the
APIR device equals the float64 reference, and the tree's protocol layer equals the pin.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision.apir import ops as apir_ops
from tests.apir.test_virgl_apir import shared_archive

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.podman, pytest.mark.nix]
REPO = Path(__file__).resolve().parents[2]


def test_the_apir_route_runs_end_to_end_from_the_shared_tree(tmp_path: Path) -> None:
    results_path = tmp_path / "linux-apir.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "checks" / "linux-apir"), "--virgl-src", str(shared_archive()),
         "--out", str(tmp_path / "linux-apir.md"), "--json", str(results_path)],
        capture_output=True, text=True, errors="replace", cwd=REPO, timeout=3 * 3600,
    )
    assert results_path.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(results_path.read_text())
    assert results["run_exit"] == 0 and results["worker_deaths"] == 0, proc.stdout[-3000:]
    assert results["device"].startswith("[virtgpu]")
    assert results["bench"] and all("virtgpu" in str(row["backend"]) for row in results["bench"])
    tbo = results["test_backend_ops"]
    assert set(tbo) == {op.name for op in apir_ops.LLAMA_OPS}
    for name, op in tbo.items():  # cases counted per op, each op run on the remote device
        assert op["exit"] == 0 and op["ran"] >= 1 and op["passed"] == op["ran"] and op["ok"], (name, op)
    text = results["text"]
    assert text["apir"] and text["apir_equals_reference"] and text["equal"] and text["ok"], text
    assert all(results["protocol"].values()), results["protocol"]
    assert results["ok"] and proc.returncode == 0
