"""The bench history on this machine: a JSON Lines file in the cache, one record per run.

Where it lives (``<cache>/bench/history.jsonl``, so ``PROVISION_CACHE`` moves it too), what a
record says about this host and the model, and the append/read through the append-only JSONL
file (jsonl.py: one locked ``O_APPEND`` write per record). Shared by `provision bench` and
`provision perplexity`; the records themselves are history.py's, `bench list`/`compare` the CLI's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import re
import socket
from pathlib import Path
from typing import Any

from provision.bench import history, jsonl, perplexity
from provision.core import paths
from provision.core.catalog import Stack
from provision.core.paths import cache_dir

FILE = "history.jsonl"
_BLOB = re.compile(r"^sha256-([0-9a-f]{64})$")  # the model store's blob names (provision/models/store.py)


def path() -> Path:
    return cache_dir("bench") / FILE


def host() -> dict[str, str]:
    return {"name": socket.gethostname(), "os": platform.system().lower(), "machine": platform.machine()}


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def file_sha256(model: Path) -> str:
    """A file's sha256: a model store blob is named by it; any other file is hashed (streamed)."""
    m = _BLOB.match(model.name)
    if m:
        return m.group(1)
    digest = hashlib.sha256()
    with model.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def append(record: history.Record, where: Path | None = None) -> Path:
    target = where or path()
    jsonl.append(target, record.as_dict())
    return target


def load(where: Path | None = None) -> tuple[list[history.Record], int]:
    """Every record, oldest first, and how many lines were skipped (torn or not a record)."""
    lines = jsonl.read(where or path())
    records, bad = history.parse(lines.records)
    return records, bad + lines.skipped


def record_bench(
    stack: Stack, model: Path, label: str, report: dict[str, Any], gpu_where: str, outputs: list[str]
) -> history.Record:
    """Append the record of a finished `provision bench` (its report, the raw llama-bench outputs)."""
    record = history.make(
        kind="bench",
        time=now(),
        host=host(),
        stack=stack.name,
        route=stack.route,
        device=history.bench_device(report["results"], gpu_where, outputs),
        model=label,
        model_sha256=file_sha256(model),
        llama_build=history.llama_build(outputs),
        results=history.bench_measures(report["results"]),
        extra={"gate_factor": report["gate"]["factor"], "remoting_ratio": report.get("remoting_ratio") or {},
               "accel": report.get("accel"), "report": report.get("json")},  # fmt: skip
    )
    append(record)
    return record


def record_perplexity(
    stack: Stack, gpu: bool, model: Path, label: str, estimate: tuple[float, float], output: str,
    extra: dict[str, Any],
) -> history.Record:
    """Append the record of a finished `provision perplexity` (lower is better)."""
    ppl, error = estimate
    place = perplexity.where(stack, gpu)
    record = history.make(
        kind="perplexity",
        time=now(),
        host=host(),
        stack=stack.name,
        route=stack.route if gpu else "cpu",
        device=(perplexity.used_device(output, stack.device) or stack.device or "remote") if gpu else "CPU",
        model=label,
        model_sha256=file_sha256(model),
        llama_build=history.llama_build([output]),
        results=[history.Measure(place, "ppl", ppl, error, "ppl")],
        extra=extra,
    )
    append(record)
    return record


# --- the bench reports `provision bench` wrote beside the history: APIR against Venus ------------


def speedup_from_report(data: Any) -> float | None:
    """Mean tg tokens/s of APIR over Venus in one bench report (None unless it has both)."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        return None
    tg: dict[str, list[float]] = {"guest-apir": [], "guest-gpu": []}
    for r in data["results"]:
        if isinstance(r, dict) and r.get("where") in tg and str(r.get("test", "")).startswith("tg"):
            try:
                tg[r["where"]].append(float(r["tokens_per_s"]))
            except (KeyError, TypeError, ValueError):
                continue
    apir, venus = tg["guest-apir"], tg["guest-gpu"]
    if not apir or not venus or sum(venus) <= 0:
        return None
    return (sum(apir) / len(apir)) / (sum(venus) / len(venus))


def apir_speedup_measured() -> float | None:
    """From the newest bench report that measured both routes (the route choice's tie-breaker)."""
    bench = paths.cache_root() / "bench"
    reports = sorted(bench.glob("*.json"), key=lambda p: p.stat().st_mtime) if bench.is_dir() else []
    for found_in in reversed(reports):
        try:
            found = speedup_from_report(json.loads(found_in.read_text()))
        except (OSError, ValueError):
            continue
        if found is not None:
            return found
    return None
