"""Benchmarks: llama-bench JSON -> results, the GPU gate, a table, a JSON report, a PNG.

Pure except ``write_report``/``plot``. ``where`` names the place a number came from:
``guest-gpu`` (Vulkan0 in the guest, i.e. Venus), ``guest-apir`` (the ggml-virtgpu device of
the APIR route), ``guest-cpu`` and ``host-native`` (llama.cpp on the host's own Vulkan device).
The gate compares prompt processing: the remoted GPU (Venus, or APIR on the APIR route) must
beat the guest's CPU by ``GATE_FACTOR``, or E025.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.core import outputs
from provision.core.errors import BenchGateFailed, InvalidValue

GATE_FACTOR = 2.0
SECTION = re.compile(r"^@@krun-bench (\S+)$", re.M)


@dataclass(frozen=True)
class BenchResult:
    where: str
    test: str  # pp<N> or tg<N>
    tokens_per_s: float
    stddev: float
    backend: str
    device: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_llama_bench(where: str, text: str) -> list[BenchResult]:
    """Results from ``llama-bench -o json`` output (a JSON array, maybe after log lines)."""
    start = text.find("[")
    end = text.rfind("]")
    if start < 0 or end < start:
        raise InvalidValue(f"llama-bench output for {where} has no JSON array: {text[-300:]!r}")
    try:
        rows = json.loads(text[start : end + 1])
    except json.JSONDecodeError as exc:
        raise InvalidValue(f"llama-bench output for {where} is not JSON: {exc}") from None
    out = []
    for row in rows:
        n_prompt, n_gen = int(row.get("n_prompt", 0)), int(row.get("n_gen", 0))
        test = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}"
        out.append(
            BenchResult(
                where=where,
                test=test,
                tokens_per_s=float(row["avg_ts"]),
                stddev=float(row.get("stddev_ts", 0.0)),
                backend=str(row.get("backends", "")),
                device=str(row.get("devices", row.get("gpu_info", ""))),
            )
        )
    return out


def split_sections(text: str) -> dict[str, str]:
    """The guest prints ``@@krun-bench NAME`` before each llama-bench run."""
    parts = SECTION.split(text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _pp(results: list[BenchResult], where: str) -> BenchResult | None:
    return next((r for r in results if r.where == where and r.test.startswith("pp")), None)


@dataclass(frozen=True)
class Gate:
    gpu_pp: float
    cpu_pp: float
    factor: float
    required: float

    @property
    def holds(self) -> bool:
        return self.cpu_pp > 0 and self.factor >= self.required

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "holds": self.holds}


REMOTE_PLACES = ("guest-gpu", "guest-apir")


def gate(results: list[BenchResult], required: float = GATE_FACTOR, gpu_where: str = "guest-gpu") -> Gate:
    gpu, cpu = _pp(results, gpu_where), _pp(results, "guest-cpu")
    if gpu is None or cpu is None:
        raise InvalidValue(f"the gate needs pp results for {gpu_where} and guest-cpu")
    return Gate(
        gpu.tokens_per_s, cpu.tokens_per_s, gpu.tokens_per_s / cpu.tokens_per_s if cpu.tokens_per_s else 0.0, required
    )


def remoting_ratios(results: list[BenchResult], where: str = "guest-gpu") -> dict[str, float]:
    """Remoted t/s (Venus: guest-gpu, APIR: guest-apir) over host-native t/s, per test (1.0 = no cost)."""
    out = {}
    for r in results:
        if r.where != where:
            continue
        host = next((h for h in results if h.where == "host-native" and h.test == r.test), None)
        if host and host.tokens_per_s > 0:
            out[r.test] = r.tokens_per_s / host.tokens_per_s
    return out


def check_gate(g: Gate) -> None:
    if not g.holds:
        raise BenchGateFailed(
            f"pp on the guest GPU is {g.gpu_pp:.1f} t/s, only {g.factor:.2f}x the guest CPU's "
            f"{g.cpu_pp:.1f} t/s (need >= {g.required:g}x)",
            fix="check that Vulkan0 is the Venus device (VK_DRIVER_FILES, GGML_VK_VISIBLE_DEVICES), "
            "not a CPU fallback",
        )


def rows(results: list[BenchResult]) -> list[tuple[str, str, str, str, str]]:
    return [(r.where, r.test, f"{r.tokens_per_s:.1f}", f"{r.stddev:.1f}", r.device or r.backend) for r in results]


HEADERS = ("WHERE", "TEST", "T/S", "STDDEV", "DEVICE")


def report(stack: str, model: str, results: list[BenchResult], g: Gate, meta: dict[str, Any],
           gpu_where: str = "guest-gpu") -> dict[str, Any]:
    data = {
        "stack": stack,
        "model": model,
        "results": [r.as_dict() for r in results],
        "gate": g.as_dict(),
        "remoting_ratio": remoting_ratios(results, gpu_where),
        **meta,
    }
    if gpu_where != "guest-gpu" and any(r.where == "guest-gpu" for r in results):
        data["remoting_ratio_venus"] = remoting_ratios(results, "guest-gpu")
    return data


def markdown(data: dict[str, Any]) -> str:
    """The report as a markdown table plus its ratios, for bench/results/."""
    lines = ["| where | test | t/s | stddev | device |", "|---|---|---:|---:|---|"]
    for r in data["results"]:
        lines.append(f"| {r['where']} | {r['test']} | {r['tokens_per_s']:.1f} | {r['stddev']:.1f} | "
                     f"{r['device'] or r['backend']} |")
    g = data["gate"]
    lines += ["", f"- gate (pp remoted GPU / guest CPU): {g['factor']:.2f}x, need >= {g['required']:g}x: "
              f"{'holds' if g['holds'] else 'FAILS'}"]
    for key in ("remoting_ratio", "remoting_ratio_venus"):
        if data.get(key):
            lines.append(f"- {key} (over host native): " + ", ".join(f"{k} {v:.2f}" for k, v in data[key].items()))
    return "\n".join(lines) + "\n"


def _write_whole(path: Path, text: str) -> Path:
    outputs.write_text(path, text, flag="--out", force=True)  # the one whole-or-nothing writer
    return path


def write_report(data: dict[str, Any], path: Path) -> Path:
    return _write_whole(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_markdown(data: dict[str, Any], path: Path) -> Path:
    return _write_whole(path, markdown(data))


@dataclass(frozen=True)
class BenchRun:
    """What one `provision bench` measured: the report (as written to JSON), its rows and its gate."""

    data: dict[str, Any]
    results: list[BenchResult]
    gate: Gate
    outputs: list[str] = field(default_factory=list)  # each guest's raw llama-bench output (its build line)


def plot(results: list[BenchResult], title: str, path: Path) -> Path | None:
    """A grouped bar chart of t/s per test and place; None when matplotlib is absent."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tests = sorted({r.test for r in results}, key=lambda t: (t[:2], int(t[2:])))
    wheres = [w for w in ("guest-apir", "guest-gpu", "guest-cpu", "host-native") if any(r.where == w for r in results)]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(wheres), 1)
    for i, w in enumerate(wheres):
        vals = [next((r.tokens_per_s for r in results if r.where == w and r.test == t), 0.0) for t in tests]
        ax.bar([x + i * width for x in range(len(tests))], vals, width, label=w)
    ax.set_xticks([x + width * (len(wheres) - 1) / 2 for x in range(len(tests))], tests)
    ax.set_ylabel("tokens/s")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".partial.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.rename(path)
    return path
