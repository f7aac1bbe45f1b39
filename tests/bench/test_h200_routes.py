"""checks/h200-routes: the committed H200 tables are what `tables` makes of the committed reports, and the
run's per-op limits reach the guest job as written (the device run itself needs the lent machine)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from provision.apir import ops as apir_ops

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def load(name: str) -> ModuleType:
    path = REPO / "checks" / "h200-routes" / name
    loader = importlib.machinery.SourceFileLoader(f"h200_routes_{name}", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_committed_tables_are_made_from_the_committed_reports() -> None:
    made = subprocess.run([sys.executable, str(REPO / "checks" / "h200-routes" / "tables"),
                           str(RESULTS / "h200-routes" / "2026-12-02")],
                          capture_output=True, text=True, check=True).stdout
    page = (RESULTS / "h200-routes.md").read_text()
    rows = [line for line in made.splitlines() if line.startswith("| apir") or line.startswith("| venus")]
    assert len(rows) == 4 + 2 * len(apir_ops.LLAMA_OPS)
    for row in rows:
        assert row in page, row
    # each route's ratio is guest over native of the same call, both present
    bench = [r for r in rows if "| pp512 |" in r or "| tg128 |" in r]
    assert all(re.search(r"\| \d+\.\d\d \|$", r) for r in bench), bench


def test_the_guest_job_gives_each_named_op_its_own_limit() -> None:
    run = load("run")
    limits = run.op_seconds("GET_ROWS=30,CONT=60")
    assert limits == {"GET_ROWS": 30, "CONT": 60}
    lines = run.tbo_lines("test-backend-ops", "Vulkan0", 20, limits)
    timeouts = dict(re.findall(r"^timeout (\d+) .* -o (\S+)", line, re.M)[0][::-1]
                    for line in lines if line.startswith("timeout"))
    assert timeouts == {op.name: str(limits.get(op.name, 20)) for op in apir_ops.LLAMA_OPS}


@pytest.mark.parametrize("bad", ["FOO=3", "GET_ROWS=", "GET_ROWS=-1", "GET_ROWS=0", "CONT"])
def test_a_bad_op_limit_is_refused_before_any_machine_time(bad: str) -> None:
    with pytest.raises(SystemExit, match="OP=SECONDS"):
        load("run").op_seconds(bad)


def test_the_prepare_script_reaches_what_it_calls() -> None:
    """prepare runs only before a device call, so a moved function breaks it far from any test: load it
    and look up what it calls on the Linux host."""
    prepare = load("prepare")
    assert callable(prepare.linux.image_for) and callable(prepare.linux.root_disk)
