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
        passed, total = (int(n) for n in str(op["passed"]).split("/"))  # "48/48": test-backend-ops' own count
        assert op["exit"] == 0 and op["ran"] >= 1 and passed == total == op["ran"], (name, op)
        assert op["finished"] and not op["failed"] and op["ok"], (name, op)
    text = results["text"]
    assert text["apir"] and text["apir_equals_reference"] and text["equal"] and text["ok"], text
    assert all(results["protocol"].values()), results["protocol"]
    assert results["ok"] and proc.returncode == 0


# Several ggml programs one after another, each writing only to a file, with more silence after
# each than the old watch allowed (45 s): each program's render worker ends with its context.
# llama-bench --list-devices holds its context for well under a second (a poll may miss it);
# each test-backend-ops run holds its for seconds, so the watch must have judged those two
# (the last one closed before the guest ends: a context open at power-off is never judged).
SILENT_JOB = r"""
llama-bench --list-devices > /tmp/a 2>&1
sleep 50
test-backend-ops test -b "[virtgpu] Vulkan0" -o ADD -p 'type=f32,ne=\[10,5,4,3\]' > /tmp/b 2>&1
echo "tbo rc=$?" >> /tmp/b
sleep 50
test-backend-ops test -b "[virtgpu] Vulkan0" -o MUL -p 'type=f32,ne=\[10,5,4,3\]' > /tmp/c 2>&1
echo "tbo rc=$?" >> /tmp/c
sleep 3
grep virtgpu /tmp/a
tail -n 4 /tmp/b /tmp/c
"""


def test_a_silent_guest_running_programs_one_after_another_is_not_a_worker_death(tmp_path: Path) -> None:
    provision = [sys.executable, "-m", "provision"]
    setup = [
        [*provision, "host-tools", "--apir", "--virgl-src", str(shared_archive())],
        [*provision, "image", "build", "llama-apir-linux"],
    ]
    for cmd in setup:  # cached after the first test of this module
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=3 * 3600)
        assert done.returncode == 0, done.stderr[-3000:]
    run = subprocess.run(
        [*provision, "run", "llama-apir-linux", "--gpu", "--timeout", "1500", "--", "sh", "-c", SILENT_JOB],
        capture_output=True, text=True, errors="replace", cwd=REPO, timeout=1800,
    )
    assert run.returncode == 0 and "E023" not in run.stderr, run.stderr[-3000:]
    assert "[virtgpu] Vulkan0" in run.stdout and run.stdout.count("tbo rc=0") == 2
    run_dir = Path(run.stderr.split(" run=")[1].split()[0])
    watched = json.loads((run_dir / "workers.json").read_text())
    # The watch judged both test-backend-ops contexts: held by a worker, then closed by QEMU.
    assert watched["contexts"] >= 2 and watched["closed"] >= 2 and not watched["blind"], watched
    assert watched["polls"] > 250, watched  # over 100 s of silence at 0.2 s: it kept watching throughout
