"""Issue 27, the remoting cut: patch 0004 (frontend) and 0005 (host) against the series before them.

The fast tests check how bench/apir_remoting.py splits the series and turns two loopback
profiles into a per-token one; the slow one builds both loopbacks (CPU target, `host` and
`guest` ggml builds) and runs llama-bench through each, counting the APIR commands.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from provision.hosts.linux import loopback

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "apir_remoting.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apir_remoting", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_cut_is_the_last_patch_of_both_series_and_before_lacks_only_it():
    bench = _bench()
    before, after = bench.variants()
    assert after.guest_patches == tuple(loopback.guest_patches()) and after.host_patches == loopback.HOST_PATCHES
    assert after.guest_patches[-1] == bench.CUT_GUEST and after.host_patches[-1] == bench.CUT_HOST
    assert before.guest_patches == after.guest_patches[:-1] and before.host_patches == after.host_patches[:-1]


def test_the_loopback_build_applies_the_host_patches_it_is_given():
    where = loopback.Where(llama="/s/l", loopback="/s/lb", patches="/s/p", work="/w", lib="/l")
    script = loopback.build_script(["0001-a.patch"], "cpu", where, host_patches=["0003-b.patch"])
    assert "-i /s/p/0001-a.patch" in script and "-i /s/p/0003-b.patch" in script
    cut = _bench().CUT_HOST
    assert cut not in script and f"-i /s/p/{cut}" in loopback.build_script(["0001-a.patch"], "cpu", where)


def test_per_token_is_the_difference_of_two_profiles_over_the_extra_tokens():
    bench = _bench()
    one = {"graph_compute": {"n": 2, "encode_ns": 2000, "host_ns": 10000, "reply_ns": 0},
           "device_supports_op": {"n": 90, "encode_ns": 9000, "host_ns": 9000, "reply_ns": 900}}
    many = {"graph_compute": {"n": 66, "encode_ns": 66000, "host_ns": 330000, "reply_ns": 6400},
            "device_supports_op": {"n": 90, "encode_ns": 9000, "host_ns": 9000, "reply_ns": 900}}
    prof = bench.per_token(one, many, 64)
    # setup-only commands (the same count in both runs) are not a per-token cost
    assert prof == {"graph_compute": {"n": 1.0, "encode_us": 1.0, "host_us": 5.0, "reply_us": 0.1}}
    assert bench.totals(prof) == {"n": 1.0, "encode_us": 1.0, "host_us": 5.0, "reply_us": 0.1}


@pytest.mark.slow
def test_the_cut_asks_supports_op_an_order_less_and_keeps_one_round_trip_per_token(tmp_path):
    bench = _bench()
    from provision.models import store

    setup = bench.cpu_setup(tmp_path)
    built = {v.name: bench.build(setup, v) for v in bench.variants()}
    model = store.Store().path("llama-kquant")
    results = bench.measure(setup, built, model, {"tg8": ["-p", "0", "-n", "8"]}, 2)["tg8"]
    before, after = results["before"], results["after"]
    for r in (before, after):
        # a decoded token is one GRAPH_COMPUTE and nothing else (inputs and logits go through
        # the shared buffers llama.cpp maps from the host pointer)
        assert r["per_token"]["graph_compute"]["n"] == pytest.approx(1.0)
        assert r["total"]["n"] == pytest.approx(1.0)
        assert r["ts"] > 0
    # every scheduler split asked the host about every node; 0004 asks once per description
    asked_before = before["setup_commands"]["device_supports_op"]
    asked_after = after["setup_commands"]["device_supports_op"]
    assert asked_before > 500 and asked_after * 5 < asked_before, (asked_before, asked_after)
