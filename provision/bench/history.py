"""The bench history: one record per `provision bench` or `provision perplexity` run, and comparisons.

Pure: records are built from a finished run's report and what was measured, parsed back from the
JSON lines the history file holds (history_file.py, jsonl.py), picked by id or position, listed
and compared. A record says where the numbers came from: the host, the stack and its route, the
device, the model's sha256 and the llama.cpp build, so two records are only compared knowingly.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from provision.core.errors import InvalidValue

SCHEMA = 1
KINDS = ("bench", "perplexity")
# The line every llama.cpp tool logs at start-up (common_init), e.g. "build: 6542 (0c1e5709) with ...".
_BUILD_LINE = re.compile(r"build: (\d+) \(([0-9a-fA-F]+|unknown)\)")
_ID = re.compile(r"^[0-9a-f]{4,12}$")
_SECTION = re.compile(r"^@@krun-bench \S+$", re.M)  # = bench.report.SECTION: one marker before each llama-bench run


@dataclass(frozen=True)
class Measure:
    """One number: tokens/s of a llama-bench test, or a perplexity (lower is better)."""

    where: str  # guest-gpu, guest-apir, guest-cpu, host-native
    test: str  # pp256, tg16, ppl
    value: float
    stddev: float
    unit: str  # "t/s" or "ppl"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Record:
    id: str
    time: str  # UTC, ISO 8601
    kind: str
    host: dict[str, str]
    stack: str
    route: str
    device: str
    model: str
    model_sha256: str
    llama_build: dict[str, str]
    results: tuple[Measure, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [m.as_dict() for m in self.results]
        return {"schema": SCHEMA, **data}


def make(
    *,
    kind: str,
    time: str,
    host: Mapping[str, str],
    stack: str,
    route: str,
    device: str,
    model: str,
    model_sha256: str,
    llama_build: Mapping[str, str],
    results: Iterable[Measure],
    extra: Mapping[str, Any] | None = None,
) -> Record:
    """A record whose id is a hash of its content (the same run never gets two ids)."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}")
    body = {"kind": kind, "time": time, "host": dict(host), "stack": stack, "route": route, "device": device,
            "model": model, "model_sha256": model_sha256, "llama_build": dict(llama_build),
            "results": [m.as_dict() for m in results], "extra": dict(extra or {})}  # fmt: skip
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return from_dict({"id": digest, **body})


def bench_measures(results: Sequence[Mapping[str, Any]]) -> list[Measure]:
    """The report's llama-bench results (bench.report's ``results``) as measures."""
    return [Measure(r["where"], r["test"], float(r["tokens_per_s"]), float(r.get("stddev", 0.0)), "t/s")
            for r in results]  # fmt: skip


def bench_device(results: Sequence[Mapping[str, Any]], gpu_where: str, texts: Iterable[str] = ()) -> str:
    """The remoted GPU's device as llama-bench named it: its ggml name and, from the raw JSON's
    ``gpu_info``, what it is (e.g. "Vulkan0: Virtio-GPU Venus (llvmpipe …)")."""
    name = next((str(r.get("device") or r.get("backend") or "") for r in results if r["where"] == gpu_where), "")
    info = next((str(row["gpu_info"]) for text in texts for row in _json_rows(text) if row.get("gpu_info")), "")
    return f"{name}: {info}" if name and info else (name or info)


def llama_build(texts: Iterable[str]) -> dict[str, str]:
    """The llama.cpp build of the first output that names one: llama-bench's JSON fields
    ``build_commit``/``build_number``, else the ``build: N (COMMIT)`` log line every tool prints."""
    for text in texts:
        for row in _json_rows(text):
            if row.get("build_commit") or row.get("build_number"):
                return {"commit": str(row.get("build_commit", "")), "number": str(row.get("build_number", ""))}
        m = _BUILD_LINE.search(text)
        if m:
            return {"commit": m.group(2), "number": m.group(1)}
    return {"commit": "", "number": ""}


def _json_rows(text: str) -> list[dict[str, Any]]:
    """The rows of every llama-bench JSON array in ``text`` (one per ``@@krun-bench`` section)."""
    out: list[dict[str, Any]] = []
    for part in _SECTION.split(text):
        start, end = part.find("["), part.rfind("]")
        if start < 0 or end < start:
            continue
        try:
            rows = json.loads(part[start : end + 1])
        except json.JSONDecodeError:
            continue
        out += [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    return out


def from_dict(data: Mapping[str, Any]) -> Record:
    """A record read back from the history; InvalidValue (with the field) for one that is not."""
    try:
        results = tuple(
            Measure(str(m["where"]), str(m["test"]), float(m["value"]), float(m.get("stddev", 0.0)), str(m["unit"]))
            for m in data["results"]
        )
        record = Record(
            id=str(data["id"]), time=str(data["time"]), kind=str(data["kind"]),
            host={str(k): str(v) for k, v in dict(data["host"]).items()}, stack=str(data["stack"]),
            route=str(data["route"]), device=str(data["device"]), model=str(data["model"]),
            model_sha256=str(data["model_sha256"]),
            llama_build={str(k): str(v) for k, v in dict(data["llama_build"]).items()},
            results=results, extra=dict(data.get("extra") or {}),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidValue(f"a history record is malformed ({type(exc).__name__}: {exc})") from None
    if record.kind not in KINDS or not _ID.match(record.id):
        raise InvalidValue(f"a history record has kind {record.kind!r}, id {record.id!r}")
    return record


def parse(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Record], int]:
    """Records from the file's JSON objects, and how many were not records (kept, not fatal)."""
    records, bad = [], 0
    for row in rows:
        try:
            records.append(from_dict(row))
        except InvalidValue:
            bad += 1
    return records, bad


def select(records: Sequence[Record], *, stack: str | None = None, kind: str | None = None) -> list[Record]:
    return [r for r in records if (stack is None or r.stack == stack) and (kind is None or r.kind == kind)]


def pick(records: Sequence[Record], ref: str) -> Record:
    """A record by id (a unique prefix of 4+ hex digits) or by position: -1 the newest, -2 the one before."""
    if re.fullmatch(r"-[1-9][0-9]{0,5}", ref):
        n = int(ref)
        if -n > len(records):
            raise InvalidValue(f"history position {ref}: the history holds {len(records)} record(s)",
                               fix="`provision bench list` shows the records and their ids")  # fmt: skip
        return records[n]
    if not _ID.match(ref):
        raise InvalidValue(f"history record {ref!r}: expected an id (4-12 hex digits) or a position like -1",
                           fix="`provision bench list` shows the ids; -1 is the newest record")  # fmt: skip
    found = [r for r in records if r.id.startswith(ref)]
    if len(found) != 1:
        why = "no record has" if not found else f"{len(found)} records have"
        raise InvalidValue(f"history record {ref!r}: {why} that id",
                           fix="`provision bench list` shows the ids; give more digits if several match")  # fmt: skip
    return found[0]


def summary(record: Record) -> str:
    """The record's headline numbers, e.g. ``guest-gpu pp256 412.3 t/s, tg16 20.1 t/s``."""
    parts, last = [], None
    for m in record.results:
        head = f"{m.where} " if m.where != last else ""
        parts.append(f"{head}{m.test} {m.value:.4g} {m.unit}")
        last = m.where
    return ", ".join(parts)


LIST_HEADERS = ("ID", "TIME", "KIND", "STACK", "ROUTE", "DEVICE", "MODEL", "BUILD", "RESULTS")


def list_rows(records: Sequence[Record]) -> list[tuple[str, ...]]:
    return [(r.id, r.time, r.kind, r.stack, r.route, r.device[:40], r.model, _build(r), summary(r)) for r in records]


def _build(r: Record) -> str:
    number, commit = r.llama_build.get("number", ""), r.llama_build.get("commit", "")
    return f"{number} ({commit[:9]})" if number and commit else (number or commit[:9] or "-")


@dataclass(frozen=True)
class Comparison:
    where: str
    test: str
    unit: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        """B over A (for t/s above 1.0 means B is faster; for perplexity below 1.0 means B is better)."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def compare(a: Record, b: Record) -> list[Comparison]:
    """Every (place, test) of either record, side by side, A's order first."""
    keys: list[tuple[str, str, str]] = []
    for m in (*a.results, *b.results):
        if (m.where, m.test, m.unit) not in keys:
            keys.append((m.where, m.test, m.unit))
    va = {(m.where, m.test, m.unit): m.value for m in a.results}
    vb = {(m.where, m.test, m.unit): m.value for m in b.results}
    return [Comparison(w, t, u, va.get((w, t, u)), vb.get((w, t, u))) for w, t, u in keys]


def differences(a: Record, b: Record) -> list[str]:
    """What differs between the two runs besides the numbers (so a ratio is read knowingly)."""
    out = []
    for name in ("kind", "stack", "route", "device", "model", "model_sha256"):
        if getattr(a, name) != getattr(b, name):
            out.append(f"{name}: {getattr(a, name) or '-'} -> {getattr(b, name) or '-'}")
    if _build(a) != _build(b):
        out.append(f"llama.cpp build: {_build(a)} -> {_build(b)}")
    if a.host != b.host:
        out.append(f"host: {a.host.get('name', '?')} -> {b.host.get('name', '?')}")
    return out


COMPARE_HEADERS = ("WHERE", "TEST", "A", "B", "B/A")


def compare_rows(rows: Sequence[Comparison]) -> list[tuple[str, ...]]:
    def num(v: float | None, unit: str) -> str:
        return "-" if v is None else f"{v:.4g} {unit}"

    return [(c.where, c.test, num(c.a, c.unit), num(c.b, c.unit), "-" if c.ratio is None else f"{c.ratio:.3f}")
            for c in rows]  # fmt: skip
