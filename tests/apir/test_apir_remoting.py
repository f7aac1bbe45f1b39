"""The remoting cuts (issues 27 and 40): APIR 0.3, patches 0006 (shared), 0007 (guest), 0008 (host);
APIR 0.4, 0011 (shared), 0012 and 0014 (guest), 0013 (host); APIR 0.5, 0015 (shared), 0016 (guest), 0017 (host);
APIR 0.6, 0022 (shared), 0023 (guest), 0024 (host).

Fast tests: how bench/apir_remoting.py splits the series, turns two loopback profiles into a
per-token one, and that every build of the host library (Linux builds, the loopback, Nix, the macOS
cross build) and every APIR guest image applies its half of the series. Slow ones build the pinned
tree with the series (CPU target, no VM): the patched headers say the pinned protocol, a llama-like
decode loop through the loopback gives the right values with one GRAPH_RUN and no SET_TENSOR or
GET_TENSOR per token (also when one graph's outputs go to successive places, as a batch's ubatches; into
the device's host buffer the host writes them itself, into guest memory they are copied; the host's
graph has the guest's use counts; a big input computed into a host buffer goes by reference), 0.2 to 0.5
guests are refused by a 0.6 host with a message, so are hostile tensors and graphs (0018) and by-reference
writes, tensor commands leave nothing on the host's heap (0019), several virgl contexts in one process share the
backend and each frees only its own buffers (0020), and greedy decoding through the route (its prompt's
embeddings by reference) gives the same tokens as native (the CI gate: correctness, never speed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from provision.apir import builds
from provision.apir import ggml as ggml_build
from provision.core import catalog, pins
from provision.hosts.linux.apir import loopback, loopback_no_chroot
from provision.images import sources

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "apir_remoting.py"
SHARED, GUEST, HOST, ZERO = (
    "0006-ggml-virtgpu-apir-0.3-graph-run-protocol.patch",
    "0007-ggml-virtgpu-one-round-trip-per-token.patch",
    "0008-ggml-virtgpu-backend-graph-run.patch",
    "0009-ggml-virtgpu-backend-zero-new-buffers.patch",
)
OUT_SHARED, OUT_GUEST, OUT_HOST = (
    "0011-ggml-virtgpu-apir-0.4-outputs-with-the-graph-protocol.patch",
    "0012-ggml-virtgpu-outputs-with-the-graph.patch",
    "0013-ggml-virtgpu-backend-outputs-with-the-graph.patch",
)
RUN_LATER = "0014-ggml-virtgpu-run-when-the-outputs-are-wanted.patch"
USES_SHARED, USES_GUEST, USES_HOST = (
    "0015-ggml-virtgpu-apir-0.5-use-counts-protocol.patch",
    "0016-ggml-virtgpu-send-use-counts.patch",
    "0017-ggml-virtgpu-backend-use-counts.patch",
)
# APIR 0.6: a big input the guest computed into shared pages goes by reference (no guest copy).
REF_SHARED, REF_GUEST, REF_HOST = (
    "0022-ggml-virtgpu-apir-0.6-writes-by-reference-protocol.patch",
    "0023-ggml-virtgpu-send-inputs-by-reference.patch",
    "0024-ggml-virtgpu-backend-writes-by-reference.patch",
)
# Host library only, no protocol change: hostile tensors and graphs refused.
HOSTILE = "0018-ggml-virtgpu-backend-refuse-hostile-tensors-and-graphs.patch"
# Host library only, no protocol change: the tensors of SET/GET/CPY_TENSOR freed when the command returns.
FREED = "0019-ggml-virtgpu-backend-free-decoded-tensors.patch"
# Host library only, no protocol change: several virgl contexts in one process (krunkit) share the backend.
CONTEXTS = "0020-ggml-virtgpu-backend-serve-several-contexts.patch"
# Host library only, no protocol change: the graphs decoded are counted (for checks).
COUNTED = "0021-ggml-virtgpu-backend-count-decoded-graphs.patch"
# Guest-side, outside the cut: both loopbacks of the bench size tensors as the host asks.
ALLOC = "0010-ggml-virtgpu-ask-the-host-alloc-size.patch"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apir_remoting", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_before_is_the_series_without_apir_0_3_and_after_is_all_of_it() -> None:
    bench = _bench()
    before, after = bench.variants()
    assert after.guest_patches == tuple(loopback.guest_patches()) and after.host_patches == loopback.HOST_PATCHES
    assert set(bench.CUT) == {SHARED, GUEST, HOST, ZERO, OUT_SHARED, OUT_GUEST, OUT_HOST, RUN_LATER,
                              USES_SHARED, USES_GUEST, USES_HOST, REF_SHARED, REF_GUEST, REF_HOST}
    assert before.guest_patches == tuple(p for p in after.guest_patches if p not in (SHARED, GUEST, OUT_SHARED,
                                                                                      OUT_GUEST, RUN_LATER,
                                                                                      USES_SHARED, USES_GUEST,
                                                                                      REF_SHARED, REF_GUEST))
    assert before.host_patches == tuple(p for p in after.host_patches if p not in (SHARED, HOST, ZERO, OUT_SHARED,
                                                                                    OUT_HOST, USES_SHARED, USES_HOST,
                                                                                    HOSTILE, FREED, CONTEXTS, COUNTED,
                                                                                    REF_SHARED, REF_HOST))
    assert before.host_patches[-1].startswith("0005-")
    assert ALLOC in before.guest_patches and ALLOC in after.guest_patches


def test_every_host_build_and_every_apir_guest_applies_its_half_of_apir_0_3_to_0_6() -> None:
    assert ggml_build.HOST_PATCHES[-13:] == (SHARED, HOST, ZERO, OUT_SHARED, OUT_HOST, USES_SHARED, USES_HOST,
                                             HOSTILE, FREED, CONTEXTS, COUNTED, REF_SHARED, REF_HOST)
    nix = (REPO / "nix" / "pkgs" / "ggml-virtgpu-backend.nix").read_text()
    assert tuple(re.findall(r"patches/llama\.cpp/(\S+\.patch)", nix)) == ggml_build.HOST_PATCHES
    macho = (REPO / "checks" / "macho_link" / "ggml.py").read_text()
    assert tuple(re.findall(r"patches/llama\.cpp/(\S+\.patch)", macho)) == ggml_build.HOST_PATCHES
    for name in ("llama-apir", "llama-apir-linux"):  # the host library refuses 0.2 to 0.5 guests
        build = catalog.load().get(name).build
        assert build is not None
        names = [Path(p).name for p in build.patches]
        assert names[-10:] == [SHARED, GUEST, ALLOC, OUT_SHARED, OUT_GUEST, RUN_LATER, USES_SHARED, USES_GUEST,
                               REF_SHARED, REF_GUEST], name
        assert not {HOST, ZERO, OUT_HOST, USES_HOST, HOSTILE, FREED, CONTEXTS, COUNTED, REF_HOST} & set(names), name
    proto = pins.default().source("llama-cpp")["apir_protocol"]
    assert (proto["major"], proto["minor"], proto["upstream_minor"]) == (0, 6, 2)


def test_the_loopback_applies_the_shared_patch_once_and_builds_the_decode_check() -> None:
    where = loopback.Where(llama="/s/l", loopback="/s/lb", patches="/s/p", work="/w", lib="/l")
    script = loopback.build_script(["0001-a.patch", SHARED, GUEST], "cpu", where, host_patches=[SHARED, HOST])
    assert script.count(f"-i /s/p/{SHARED}") == 1
    assert script.index(f"/s/p/{GUEST}") < script.index(f"/s/p/{HOST}")
    assert "/s/lb/graph-run-check.cpp -o /w/bin/graph-run-check" in script
    assert "/s/lb/alloc-size-check.cpp -o /w/bin/alloc-size-check" in script
    assert "/s/lb/wide-reads-check.cpp -o /w/bin/wide-reads-check" in script


def test_per_token_is_the_difference_of_two_profiles_over_the_extra_tokens() -> None:
    bench = _bench()
    one = {"graph_run": {"n": 2, "encode_ns": 2000, "host_ns": 10000, "reply_ns": 0, "decode_ns": 4000,
                         "compute_ns": 5000, "copy_ns": 100},
           "device_supports_op": {"n": 90, "encode_ns": 9000, "host_ns": 9000, "reply_ns": 900}}
    many = {"graph_run": {"n": 66, "encode_ns": 66000, "host_ns": 330000, "reply_ns": 6400, "decode_ns": 4000,
                          "compute_ns": 261000, "copy_ns": 6500},
            "device_supports_op": {"n": 90, "encode_ns": 9000, "host_ns": 9000, "reply_ns": 900}}
    prof = bench.per_token(one, many, 64)
    # setup-only commands (the same count in both runs) are not a per-token cost; the host's
    # split comes through where the host library reports it
    assert prof == {"graph_run": {"n": 1.0, "encode_us": 1.0, "host_us": 5.0, "reply_us": 0.1, "decode_us": 0.0,
                                  "compute_us": 4.0, "copy_us": 0.1}}
    assert bench.totals(prof)["compute_us"] == 4.0 and bench.totals(prof)["n"] == 1.0


def test_a_prompt_test_is_reported_by_command_per_run_where_per_token_rounds_to_nothing() -> None:
    bench = _bench()
    # pp512 at -r 1 and -r 5: four more runs of one graph_run each, 1/512 of a command per token
    one = {"graph_run": {"n": 3, "encode_ns": 30, "host_ns": 30_000_000, "reply_ns": 3, "decode_ns": 30,
                         "compute_ns": 27_000_000, "copy_ns": 3_000_000}}
    many = {"graph_run": {"n": 7, "encode_ns": 70, "host_ns": 70_000_000, "reply_ns": 7, "decode_ns": 70,
                          "compute_ns": 63_000_000, "copy_ns": 7_000_000}}
    assert bench.per_token(one, many, 4 * 512) == {}
    per_run = bench.per_token(one, many, 4)
    assert per_run["graph_run"]["n"] == 1.0 and per_run["graph_run"]["copy_us"] == 1000.0
    side = {"ts": 1.0, "sd": 0.0, "median": None, "per_token": {}, "total": bench.totals({})}
    report = {"device": "[virtgpu] CPU", "native_device": "CPU", "model": "m.gguf", "repetitions": 5,
              "side_by_side": [], "greedy": {"n_tokens": 1, "native": [1], "same": True, "cuda_graph_log": {}},
              "results": {"pp512": {"native": {"ts": 1.0, "sd": 0.0, "median": None},
                                    "before": {**side, "per_run": per_run}, "after": {**side, "per_run": per_run}},
                          "tg128": {"native": {"ts": 1.0, "sd": 0.0, "median": None},
                                    "before": side, "after": side}}}
    text = bench.render(report)
    assert "pp512 after: per run, by command" in text and "tg128 after: per token, by command" in text
    assert "1000.0" in text.split("pp512 after: per run")[1].split("tg128")[0]



def test_the_side_by_side_gives_the_ratio_of_medians_beside_the_ratio_of_means() -> None:
    bench = _bench()
    # one slow first repetition, as pp512 on the H100 showed (28,441 among thirty near 53,500)
    native = {"avg_ts": 50000.0, "stddev_ts": 6000.0, "samples_ts": [28000.0, 53000.0, 53500.0, 53400.0]}
    assert bench.median_ts(native) == 53200.0 and bench.median_ts({"avg_ts": 1.0}) is None
    side = {"ts": 1.0, "sd": 0.0, "total": {"n": 1.0, "encode_us": 0.0, "reply_us": 0.0, "host_us": 0.0}}
    results = {"pp512": {"native": {"ts": 50000.0, "sd": 6000.0, "median": 53200.0},
                         "before": {**side, "median": None}, "after": {**side, "ts": 45000.0, "median": 50540.0}}}
    row = bench.ratio_rows(results)[0]
    assert row["after_over_native"] == 0.9 and row["after_over_native_median"] == 0.95
    results["pp512"]["native"]["median"] = None  # an older llama-bench without samples: no median ratio
    assert bench.ratio_rows(results)[0]["after_over_native_median"] is None


def test_first_diff_names_the_first_token_where_the_route_leaves_native() -> None:
    bench = _bench()
    assert bench.first_diff({"native": [5, 7, 9, 9], "route": [5, 7, 0, 9]}) == 2
    assert bench.first_diff({"native": [5, 7], "route": [5, 7]}) is None
    with pytest.raises(ValueError):  # a short run is not "the same so far"
        bench.first_diff({"native": [5, 7], "route": [5]})

@pytest.mark.slow
def test_the_series_applies_in_each_builds_order_and_the_headers_say_the_pinned_protocol() -> None:
    tree = sources.llama_cpp_tree()
    proto = pins.default().source("llama-cpp")["apir_protocol"]
    build = catalog.load().get("llama-apir").build
    assert build is not None
    guest = tuple(Path(p).name for p in build.patches)
    for names in (tuple(loopback.guest_patches()), ggml_build.HOST_PATCHES, guest):
        patched = builds.patched_tree(tree, names, "test-apir-0.4")
        assert sources.apir_protocol(patched) == (proto["major"], proto["minor"]), names
    host = builds.patched_tree(tree, ggml_build.HOST_PATCHES, "test-apir-0.4")
    table = (host / "ggml/src/ggml-virtgpu/backend/backend-dispatched.gen.h").read_text()
    assert "APIR_COMMAND_TYPE_BACKEND_GRAPH_RUN  = */ backend_backend_graph_run" in table


def _loopback(tmp_path: Path, name: str, guest: tuple[str, ...], host: tuple[str, ...],
              like: loopback_no_chroot.HostDirs | None = None) -> loopback_no_chroot.HostDirs:
    dirs = loopback_no_chroot.HostDirs(tree=sources.llama_cpp_tree(), loopback_src=loopback.loopback_dir(),
                                  patches=REPO / "patches" / "llama.cpp", work=tmp_path / name,
                                  drm_include=builds.drm_headers(), lib=builds.ensure("host").bin_dir)
    dirs.work.mkdir(parents=True)
    if like is not None:  # test-backend-ops.o does not change with the patches: compiled once
        shutil.copy2(like.work / "test-backend-ops.o", dirs.work / "test-backend-ops.o")
    script = loopback_no_chroot.build_script(dirs, guest, "cpu", host)
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return dirs


def _loopback_env(dirs: loopback_no_chroot.HostDirs, stats: Path, **extra: str) -> dict[str, str]:
    """The loopback's checks on the remote CPU without host-pointer buffers, as a GPU (tensor data crosses as
    commands), counting into ``stats``; only the system's default PATH (os.defpath), nothing of this shell's."""
    return {"PATH": os.defpath, **loopback_no_chroot.bench_env(dirs, "cpu"), "APIR_LOOPBACK_STATS": str(stats),
            "APIR_LOOPBACK_NO_HOST_PTR": "1", **extra}


def _decode_check(dirs: loopback_no_chroot.HostDirs, tokens: int, stats: Path,
                  mode: str = "tokens") -> subprocess.CompletedProcess[str]:
    env = _loopback_env(dirs, stats)
    return subprocess.run([str(dirs.bin / "graph-run-check"), loopback.TARGETS["cpu"][2], str(tokens), mode],
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def _decode_report(dirs: loopback_no_chroot.HostDirs, tokens: int, stats: Path,
                   mode: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """graph-run-check with every value right, and the loopback's stats of the run."""
    proc = _decode_check(dirs, tokens, stats, mode)
    assert proc.returncode == 0 and f"{tokens} tokens on [virtgpu] CPU, 0 wrong values" in proc.stdout, (
        proc.stdout + proc.stderr)[-3000:]
    return proc, json.loads(stats.read_text())


@pytest.mark.slow
# tokens: each output read, as llama.cpp reads its logits (get_tensor_async, then synchronize), into the same
# place of a buffer of the device's host buffer type, where llama.cpp keeps them; ubatches: pairs of runs of
# one graph read into the two halves of such a buffer and checked once both are done (a batch of two
# ubatches with all outputs), where an output brought back for the wrong place would show; guest-memory:
# into plain memory; sync: a synchronous compute and ggml_backend_tensor_get (test-backend-ops' way).
@pytest.mark.parametrize("mode", ["tokens", "ubatches", "guest-memory", "sync"])
def test_a_decode_loop_is_one_graph_run_per_token_with_its_input_output_and_right_values(tmp_path: Path,
                                                                                         mode: str) -> None:
    dirs = _loopback(tmp_path, "after", tuple(loopback.guest_patches()), loopback.HOST_PATCHES)
    counts: dict[int, dict[str, dict[str, int]]] = {}
    lookups: dict[int, int] = {}
    decoded: dict[int, int] = {}
    for tokens in (2, 12):
        proc, report = _decode_report(dirs, tokens, tmp_path / f"stats-{tokens}.json", mode)
        counts[tokens], lookups[tokens] = report["commands"], report["other_resource_lookups"]
        decoded[tokens] = report["host_graphs_decoded"]
        # "running" (a run's commands for the bench's per-run profile) starts after the first graph computed:
        # the other tokens' runs are in it, the buffers made before it are not.
        assert report["running"]["graph_run"]["n"] == tokens - 1, report["running"]
        assert "buffer_type_alloc_buffer" not in report["running"], report["running"]
        # 0015-0017: the graph the host decoded has the use counts ggml gave the guest's (relu(W x + b) *
        # 0.5: four nodes, three of them used once), so the host's backend may fuse as it would natively.
        nodes, uses = map(int, re.search(r"the graph's (\d+) nodes have (\d+) uses", proc.stdout).groups())
        assert (nodes, uses) == (4, 3), proc.stdout
        assert report["host_graph"] == {"nodes": nodes, "uses": uses}, report
    per_token = {cmd: (c["n"] - counts[2].get(cmd, {"n": 0})["n"]) / 10 for cmd, c in counts[12].items()}
    # The input rides with the graph and the output comes back with it: one GRAPH_RUN per token, no
    # SET_TENSOR, and never a GET_TENSOR (0014: the run waits for its read, so nothing is guessed, not even
    # at the first token).
    assert per_token["graph_run"] == 1.0
    assert {k for k, v in per_token.items() if v} == {"graph_run"}, per_token
    assert "buffer_get_tensor" not in counts[12] and "buffer_get_tensor" not in counts[2], counts[12]
    # Where the output lands: into a host buffer the host looks its resource up and writes there itself,
    # once a token; into guest memory it uses only the command's own pages (the guest copies).
    assert (lookups[12] - lookups[2]) / 10 == (1.0 if mode in ("tokens", "ubatches") else 0.0), lookups
    # Sent by uid: a repeated graph's command carries no graph, so the host decodes nothing more (0021 counts
    # the graphs it decodes: the same one graph for 2 tokens and for 12; a count, because the decode of this
    # four-node graph takes microseconds, as does a run by uid, and a loaded machine's scheduling swamps both).
    # The outputs are copied inside GRAPH_RUN (the host's copy time); a few microseconds on the CPU target, too
    # small to compare between runs, so only its presence is asserted: the right values above are the proof.
    assert decoded[2] == decoded[12] == 1, decoded
    run12, run2 = counts[12]["graph_run"], counts[2]["graph_run"]
    assert run12["compute_ns"] > 0 and run12["copy_ns"] > 0 and run2["copy_ns"] > 0


@pytest.mark.slow
def test_a_prompts_input_made_in_a_host_buffer_goes_by_reference_not_as_set_tensor(tmp_path: Path) -> None:
    # As llama.cpp makes a prompt's embeddings and KQ mask: on the CPU side, into a buffer of the device's host
    # buffer type (shared pages), 384 KiB, more than a write may wait with for the run (256 KiB); the scheduler
    # copies it to the device with ggml_backend_tensor_set. APIR 0.6 (0022-0024): the guest names the pages and
    # the host copies from them, no SET_TENSOR with the guest's copy of the bytes.
    dirs = _loopback(tmp_path, "after", tuple(loopback.guest_patches()), loopback.HOST_PATCHES)
    reports, lookups = {}, {}
    for tokens in (2, 5):
        _, report = _decode_report(dirs, tokens, tmp_path / f"stats-{tokens}.json", "prompt")
        reports[tokens], lookups[tokens] = report["running"], report["other_resource_lookups"]
        assert report["writes_by_reference"] == tokens, report  # one input a prompt, the first's too
    # Each prompt after the first: a GRAPH_RUN that takes the input by reference (sent at once: the caller may
    # write the input again once ggml_backend_tensor_set returns), then the run with its output read; nothing
    # else (the buffers' frees at exit are in both), and never a SET_TENSOR.
    more = {cmd: c["n"] - reports[2].get(cmd, {"n": 0})["n"] for cmd, c in reports[5].items()}
    assert {cmd: n for cmd, n in more.items() if n} == {"graph_run": 2 * 3}, reports
    assert reports[2]["graph_run"]["n"] == 2 * 1 and "buffer_set_tensor" not in reports[5], reports
    # two resources looked up per prompt by the host: the input's pages and the output's
    assert (lookups[5] - lookups[2]) / 3 == 2.0, lookups
    # the host's copies (the input in, the output out) are timed as copies
    assert reports[5]["graph_run"]["copy_ns"] > 0


@pytest.mark.slow
def test_reads_of_one_run_that_overflow_the_data_pages_cross_after_it_and_no_blob_is_asked(tmp_path: Path) -> None:
    # Four outputs of 8 MiB read into plain guest memory: with the run's graph the data pages (24 MiB and a
    # bit) hold three of them. The loopback refuses any resource larger than those pages, as a VM's blob window
    # may: a run that asked one temporary resource for all four reads (0014 as first written) aborts here.
    dirs = _loopback(tmp_path, "after", tuple(loopback.guest_patches()), loopback.HOST_PATCHES)
    data_pages = int(re.search(r"#define SHMEM_DATA_SIZE\s+(0x[0-9a-fA-F]+)",
                               (dirs.work / "src/ggml/src/ggml-virtgpu/virtgpu.h").read_text())[1], 16)
    stats = tmp_path / "stats.json"
    env = _loopback_env(dirs, stats, APIR_LOOPBACK_BLOB_MAX=str(data_pages))
    proc = subprocess.run([str(dirs.bin / "wide-reads-check"), loopback.TARGETS["cpu"][2], "4", "8", "2"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 runs of 4 outputs of 8 MiB on [virtgpu] CPU, 0 wrong values" in out, out[-3000:]
    report = json.loads(stats.read_text())
    commands = report["commands"]
    # no shared resource was made after the pages and the reply: every command fitted the pages
    assert report["largest_blob"] == 0, report
    # Per run: one GRAPH_RUN carrying the three reads that fit, then the fourth as GET_TENSOR (8 MiB, in the
    # pages on its own). The input's 8 MiB are too large to wait for the run: SET_TENSOR.
    assert (commands["graph_run"]["n"], commands["buffer_get_tensor"]["n"]) == (2, 2), commands
    assert commands["buffer_set_tensor"]["n"] == 2, commands


def _alloc_size_check(dirs: loopback_no_chroot.HostDirs, pad: int, stats: Path) -> subprocess.CompletedProcess[str]:
    env = _loopback_env(dirs, stats, APIR_LOOPBACK_ALLOC_PAD=str(pad))
    return subprocess.run([str(dirs.bin / "alloc-size-check"), loopback.TARGETS["cpu"][2], str(pad)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_the_guest_reserves_what_the_host_buffer_type_asks_for_once_per_description(tmp_path: Path) -> None:
    # ggml-cuda asks more than ggml_nbytes for quantized rows that need padding; the loopback's host
    # asks 256 bytes more for every quantized tensor to play that part on the CPU target.
    after = _loopback(tmp_path, "after", tuple(loopback.guest_patches()), loopback.HOST_PATCHES)
    proc = _alloc_size_check(after, 256, tmp_path / "stats.json")
    assert proc.returncode == 0 and "7 descriptions on [virtgpu] CPU, 0 wrong sizes" in proc.stdout, (
        proc.stdout + proc.stderr)[-3000:]
    # asked three times over and sized again by the allocator: one round trip per description
    assert json.loads((tmp_path / "stats.json").read_text())["commands"]["buffer_type_get_alloc_size"]["n"] == 7
    # Without 0010 the frontend answers ggml_nbytes itself: the padding overlaps the next tensor.
    without = _loopback(tmp_path, "without", tuple(p for p in loopback.guest_patches() if p != ALLOC),
                        loopback.HOST_PATCHES, like=after)
    proc = _alloc_size_check(without, 256, tmp_path / "stats-without.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "room in the buffer for weight NONE q8_0 896x4: 3808 bytes, want 4064" in out, out
    assert "get_alloc_size of node CONT q4_0 896x3: 1512 bytes, want 1768" in out, out


@pytest.mark.slow
def test_0_2_to_0_5_guests_are_refused_by_a_0_6_host_with_a_message(tmp_path: Path) -> None:
    old_guest = tuple(p for p in loopback.guest_patches()
                      if p not in (SHARED, GUEST, OUT_SHARED, OUT_GUEST, RUN_LATER, USES_SHARED, USES_GUEST, REF_SHARED,
                                   REF_GUEST))
    dirs = _loopback(tmp_path, "mixed", old_guest, loopback.HOST_PATCHES)
    # plain memory: a guest without 0012 has no host buffer type of its own to read into
    proc = _decode_check(dirs, 2, tmp_path / "stats.json", "guest-memory")
    assert proc.returncode != 0
    assert "refused: the guest speaks APIR 0.2 or older (GRAPH_COMPUTE); this host library speaks 0.6" in proc.stderr
    assert "backend function 'backend_graph_compute' failed" in proc.stderr
    # A 0.3 guest's GRAPH_RUN (no read fields), a 0.4 guest's (no use counts), a 0.5 guest's, hostile read
    # records, a graph cut short of its use counts, (0018) hostile tensors, graphs and handles, and (0024) hostile
    # by-reference writes, sent to the host's dispatcher as virglrenderer hands them over: each refused with its
    # code and a log line, before anything runs.
    env = loopback_no_chroot.run_env(dirs, "cpu")
    proc = subprocess.run([str(dirs.bin / "graph-run-refusals"), env["VIRGL_APIR_BACKEND_LIBRARY"],
                           env["APIR_LLAMA_CPP_GGML_LIBRARY_PATH"], env["APIR_LLAMA_CPP_GGML_LIBRARY_REG"]],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    codes = dict(line.rsplit(": return code ", 1) for line in proc.stdout.splitlines() if ": return code " in line)
    # APIR_GRAPH_RUN_PROTOCOL_MISMATCH (2): the guest's own message names it (0007's graph_run_failed)
    assert codes.pop("0.3 guest") == "2" and codes.pop("0.4 guest") == "2" and codes.pop("0.5 guest") == "2"
    for old in ("0.3", "0.4", "0.5"):
        assert f"refused: the guest speaks APIR {old}, this host library 0.6" in proc.stderr
    # APIR_GRAPH_RUN_BAD_REQUEST (1), each with the host's reason; the control case gets as far as the graph
    assert codes == {"read of an unknown buffer": "1", "reads_size short of n_reads": "1",
                     "reads without compute": "1", "no reads, unknown graph": "3",
                     "graph short of its use counts": "1",
                     # 0018: what upstream's host trusted, each refused with an error and the host alive for
                     # the next; the deep chain is a well-formed graph, built without recursion and run
                     "buffer type never given out": "1", "graph source unknown": "1",
                     "graph tensor past its buffer": "1", "graph tensor of no buffer": "1",
                     "graph tensor of more elements than an int64_t counts": "1", "graph view past its source": "1",
                     "a graph held for context 1": "0", "its uid from context 1": "0", "its uid from context 2": "3",
                     "graph of a 300000-long chain of sources": "0", "set_tensor past its tensor": "1",
                     "copy into a smaller tensor": "1",
                     # 0024: a by-reference write that names no resource, sets the reserved word, holds more
                     # than its tensor's buffer or ends past the address space is refused; a well-formed one is
                     # applied (and read back below)
                     "write by reference from an unknown resource": "1",
                     "write by reference with its reserved word set": "1",
                     "write by reference past its tensor's buffer": "1",
                     "write by reference whose end wraps around": "1", "write by reference": "0",
                     # 0020: the backend made afresh after the last context went runs a graph; the commands
                     # of a context never initialized, or refused, are refused (upstream ran them)
                     "a graph run by context 3 after a fresh start": "0",
                     "a command of a context never initialized": "1", "a command of the refused context": "1"}, codes
    assert proc.stderr.count("malformed read record from the guest") == 2, proc.stderr
    assert proc.stderr.count("malformed tensor write from the guest") == 4, proc.stderr
    assert "write by reference: the tensor holds the resource's bytes: yes" in proc.stdout, proc.stdout
    assert proc.stderr.count("Failed to deserialize computation graph") == 6, proc.stderr
    assert "a buffer type this host never gave out: 0x4141414141414141" in proc.stderr
    assert "malformed tensor from the guest" in proc.stderr and "malformed tensor copy from the guest" in proc.stderr
    # 0019: 150,003 well-formed SET/GET/CPY_TENSOR, each answered 0; without the fix each left a ggml context
    # on the heap: 88,202,992 bytes in all here, against 6,896 with it
    heap = re.search(r"^tensor commands: (\d+) sent, (\d+) failed, heap grown by (-?\d+) bytes \(held before: (\d+)\)$",
                     proc.stdout, re.M)
    assert heap, proc.stdout
    # held before > 0: glibc's malloc counts (under another allocator mallinfo2 says 0 and shows no leak)
    assert (int(heap[1]), int(heap[2])) == (150003, 0) and int(heap[3]) < 1 << 20 and int(heap[4]) > 0, heap[0]
    # 0020: virglrenderer's calls for three contexts in one process, as krunkit makes them. Without it context 2
    # got 13 (6 + ALREADY_INITED), and context 1's deinit freed context 2's buffer too.
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("context", "after context"))]
    assert lines == ["context 2 init: 6", "contexts 1 and 2 each with a buffer: 1",
                     "after context 1 went, context 2's buffer: 0", "after context 1 went, context 1's buffer: 1",
                     "context 3 after all went: init 6, buffer 0", "context 4 asking for another library: init 13",
                     "context 3 after context 4 went: buffer 0"], proc.stdout
    assert "context 4 asks for another GGML library than the one loaded" in proc.stderr
    assert "context 9 has no backend" in proc.stderr and "context 4 has no backend" in proc.stderr
    # the last context's deinit tore the backend down (context 3 did not just share the old one)
    torn = re.search(r"the last context goes\n(.*)graph-run-refusals: the next context comes\n", proc.stderr, re.S)
    assert torn and "The GGML backend library was loaded. Unloading it." in torn[1], proc.stderr[-2000:]


@pytest.mark.slow
def test_greedy_tokens_through_the_route_are_the_native_ones(tmp_path: Path) -> None:
    bench = _bench()
    from provision import cli

    model = tmp_path / "llama-kquant.gguf"  # written here, checked against its pin
    assert cli.main(["model", "synth", "llama-kquant", "--output", str(model)]) == 0
    setup = bench.cpu_setup(tmp_path)
    after = bench.build(setup, bench.variants()[1])
    bench.build_greedy(setup, after)
    stats = tmp_path / "greedy-stats.json"
    same = bench.greedy(setup, after, model, 24, route_extra={"APIR_LOOPBACK_STATS": str(stats)})
    assert len(same["native"]) == 24 and same["same"], same
    # The prompt (300 tokens: 300 KiB of embeddings on this model, more than a write may wait with) went in by
    # reference (APIR 0.6): computed by the guest's CPU into shared pages and read there by the host, and the
    # tokens are native's all the same.
    assert json.loads(stats.read_text())["writes_by_reference"] >= 1, stats.read_text()
    # The host's buffer type asking 4 KiB more for every tensor (as ggml-cuda asks more for some):
    # the model loads and decodes the same through the route, every weight and node sized as asked.
    padded = bench.greedy(setup, after, model, 24, route_extra={"APIR_LOOPBACK_ALLOC_PAD": "4096"})
    assert padded["route"] == same["native"], padded
