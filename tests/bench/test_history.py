"""The bench history: records appended whole under concurrency and death, read back, listed, compared."""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from provision.bench import history, history_file, jsonl
from provision.core.errors import DiskFull, InvalidValue
from tests.helpers import run_provision

HOST = {"name": "box", "os": "linux", "machine": "x86_64"}
BENCH_JSON = json.dumps([
    {"build_commit": "0c1e5709", "build_number": 11312, "n_prompt": 256, "n_gen": 0, "avg_ts": 400.0,
     "stddev_ts": 4.0, "backends": "Vulkan", "devices": "Virtio-GPU Venus (llvmpipe)"},
])  # fmt: skip


def bench_record(pp: float, tg: float, *, time: str = "2026-12-01T10:00:00Z", build: str = "11312",
                 stack: str = "llama-linux") -> history.Record:  # fmt: skip
    return history.make(
        kind="bench", time=time, host=HOST, stack=stack, route="venus", device="Virtio-GPU Venus (llvmpipe)",
        model="tiny-llama", model_sha256="ab" * 32, llama_build={"commit": "0c1e5709", "number": build},
        results=[history.Measure("guest-gpu", "pp256", pp, 1.0, "t/s"),
                 history.Measure("guest-gpu", "tg16", tg, 0.5, "t/s"),
                 history.Measure("guest-cpu", "pp256", 100.0, 1.0, "t/s")],
    )  # fmt: skip


def _append_many(path: str, worker: int, count: int) -> None:
    for i in range(count):
        rec = bench_record(float(worker * 1000 + i), 1.0, time=f"2026-12-01T10:{worker:02d}:{i % 60:02d}Z")
        jsonl.append(Path(path), {**rec.as_dict(), "pad": "x" * 5000})  # > PIPE_BUF: no atomicity for free


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = jsonl.read(path)
    assert lines.skipped == 0 and len(lines.records) == 160
    records, bad = history.parse(lines.records)
    assert bad == 0 and len({r.id for r in records}) == 160


def test_a_torn_last_line_is_skipped_and_the_next_record_starts_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_file.append(bench_record(1.0, 1.0), path)
    whole = json.dumps(bench_record(2.0, 2.0).as_dict())
    with path.open("a") as fh:  # a writer killed half-way through its line
        fh.write(whole[: len(whole) // 2])
    history_file.append(bench_record(3.0, 3.0), path)
    records, skipped = history_file.load(path)
    assert skipped == 1
    assert [r.results[0].value for r in records] == [1.0, 3.0]


def test_a_short_write_leaves_the_history_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history_file.append(bench_record(1.0, 1.0), path)
    before = path.read_bytes()
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from provision.bench import jsonl\n"
        "from provision.core.errors import DiskFull\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 100}, {resource.RLIM_INFINITY}))\n"
        "try:\n"
        f"    jsonl.append(Path({str(path)!r}), {{'pad': 'x' * 10000}})\n"
        "except DiskFull as e:\n"
        "    print(e.code); sys.exit(3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "E0" in proc.stdout, proc.stderr
    assert path.read_bytes() == before
    assert DiskFull.code != InvalidValue.code


def test_a_killed_appender_leaves_whole_records(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    code = (
        "from pathlib import Path\nfrom provision.bench import jsonl\n"
        f"while True:\n    jsonl.append(Path({str(path)!r}), {{'pad': 'y' * 200000}})\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            if path.exists() and path.stat().st_size > 2_000_000:
                break
            subprocess.run(["sleep", "0.05"], check=True)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = jsonl.read(path)
    assert len(lines.records) >= 10 and lines.skipped <= 1
    assert all(r == {"pad": "y" * 200000} for r in lines.records)


def test_record_round_trips_and_its_id_is_its_content() -> None:
    rec = bench_record(400.0, 20.0)
    again = history.from_dict(json.loads(json.dumps(rec.as_dict())))
    assert again == rec
    assert bench_record(400.0, 20.0).id == rec.id and bench_record(401.0, 20.0).id != rec.id


@pytest.mark.parametrize("broken", [{}, {"id": "zz"}, {"results": "x"}])
def test_malformed_records_are_counted_not_fatal(broken: dict[str, object]) -> None:
    good = bench_record(1.0, 1.0).as_dict()
    records, bad = history.parse([good, {**good, **broken} if broken else broken])
    assert len(records) == 1 and bad == 1


def test_pick_by_position_and_id_prefix() -> None:
    recs = [bench_record(float(i), 1.0) for i in (1, 2, 3)]
    assert history.pick(recs, "-1") is recs[2] and history.pick(recs, "-3") is recs[0]
    assert history.pick(recs, recs[1].id[:6]) is recs[1]
    for ref, words in (("-4", "holds 3"), ("zzzz", "expected an id"), ("0000", "no record")):
        with pytest.raises(InvalidValue, match=words):
            history.pick(recs, ref)


def test_compare_ratios_are_b_over_a_per_place_and_test() -> None:
    a, b = bench_record(400.0, 20.0), bench_record(600.0, 10.0, build="11400")
    rows = {(c.where, c.test): c for c in history.compare(a, b)}
    assert rows[("guest-gpu", "pp256")].ratio == pytest.approx(1.5)
    assert rows[("guest-gpu", "tg16")].ratio == pytest.approx(0.5)
    assert rows[("guest-cpu", "pp256")].ratio == pytest.approx(1.0)
    assert history.differences(a, b) == ["llama.cpp build: 11312 (0c1e5709) -> 11400 (0c1e5709)"]
    table = history.compare_rows(history.compare(a, b))
    assert ("guest-gpu", "pp256", "400 t/s", "600 t/s", "1.500") in table


def test_compare_shows_a_test_only_one_record_has_without_a_ratio() -> None:
    a = bench_record(400.0, 20.0)
    b = history.make(kind="perplexity", time="t", host=HOST, stack="llama-linux", route="venus", device="Vulkan0",
                     model="tiny-llama", model_sha256="ab" * 32, llama_build={},
                     results=[history.Measure("guest-gpu", "ppl", 512.3, 2.0, "ppl")])  # fmt: skip
    rows = history.compare(a, b)
    ppl = next(c for c in rows if c.test == "ppl")
    assert ppl.a is None and ppl.ratio is None
    assert "kind: bench -> perplexity" in history.differences(a, b)


def test_the_device_is_the_ggml_name_and_what_llama_bench_says_it_is() -> None:
    results = [{"where": "guest-gpu", "device": "Vulkan0"}, {"where": "guest-cpu", "device": "none"}]
    text = BENCH_JSON.replace('"devices"', '"gpu_info": "Virtio-GPU Venus (llvmpipe)", "devices"')
    two = f"@@krun-bench guest-gpu\n{text}\n@@krun-bench guest-cpu\nlog line [x]\n{text}\n"
    assert history.llama_build([two]) == {"commit": "0c1e5709", "number": "11312"}
    assert history.bench_device(results, "guest-gpu", [two]) == (
        "Vulkan0: Virtio-GPU Venus (llvmpipe)")  # fmt: skip
    assert history.bench_device(results, "guest-gpu") == "Vulkan0"


def test_llama_build_from_bench_json_or_the_log_line() -> None:
    assert history.llama_build(["log\n" + BENCH_JSON]) == {"commit": "0c1e5709", "number": "11312"}
    log = "main: build: 6542 (0c1e5709) with cc (Debian 15) for x86_64-linux-gnu\n"
    assert history.llama_build(["no build here", log]) == {"commit": "0c1e5709", "number": "6542"}
    assert history.llama_build(["nothing"]) == {"commit": "", "number": ""}


def test_model_digest_is_the_store_blob_name_or_the_file_hash(tmp_path: Path) -> None:
    blob = tmp_path / f"sha256-{'cd' * 32}"
    blob.write_bytes(b"not hashed")
    assert history_file.file_sha256(blob) == "cd" * 32
    other = tmp_path / "m.gguf"
    other.write_bytes(b"GGUF")
    import hashlib

    assert history_file.file_sha256(other) == hashlib.sha256(b"GGUF").hexdigest()


def test_bench_list_and_compare_print_tables_and_json(empty_cache: Path) -> None:
    a, b = bench_record(400.0, 20.0), bench_record(800.0, 30.0, time="2026-12-01T11:00:00Z")
    history_file.append(a)
    history_file.append(b)
    env = {"PROVISION_CACHE": str(empty_cache)}
    listed = run_provision("bench", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert a.id in listed.stdout and b.id in listed.stdout and "guest-gpu pp256 400 t/s" in listed.stdout
    as_json = json.loads(run_provision("bench", "list", "--format", "json", env=env).stdout)["data"]
    assert [r["id"] for r in as_json] == [a.id, b.id]
    cmp = run_provision("bench", "compare", "-2", "-1", env=env)
    assert cmp.returncode == 0, cmp.stderr
    assert "2.000" in cmp.stdout and "1.500" in cmp.stdout
    data = json.loads(run_provision("bench", "compare", a.id, b.id, "--json", env=env).stdout)["data"]
    ratios = {(r["where"], r["test"]): r["ratio"] for r in data["rows"]}
    assert ratios[("guest-gpu", "pp256")] == pytest.approx(2.0) and ratios[("guest-gpu", "tg16")] == pytest.approx(1.5)
    bad = run_provision("bench", "compare", "-1", "-5", env=env)
    assert bad.returncode == 13 and "E003" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_short_form_is_bench_run() -> None:
    from provision import cli

    assert cli.expand_short_forms(["bench", "llama-linux", "--json"]) == ["bench", "run", "llama-linux", "--json"]
    assert cli.expand_short_forms(["bench", "list"]) == ["bench", "list"]
    assert cli.expand_short_forms(["bench", "compare", "-2", "-1"]) == ["bench", "compare", "-2", "-1"]
    args = cli.build_parser().parse_args(cli.expand_short_forms(["bench", "llama-linux"]))
    assert args.func.__name__ == "run" and args.stack == "llama-linux"
