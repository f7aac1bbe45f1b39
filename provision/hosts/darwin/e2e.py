"""Verdicts and the pasteable report of the macOS end-to-end checks (checks/macos-venus,
checks/macos-apir). The scripts run the commands on a Mac and save their output; this module
parses those texts (vulkaninfo --summary, llama-bench tables), so it is tested anywhere.
checks/macos-report reads the saved files and prints the report.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

from provision.core.diagnostics import Check, failed
from provision.hosts.darwin.guest_checks import parse_vulkaninfo_summary

MIN_PP_SPEEDUP = 2.0


@dataclass(frozen=True)
class BenchRow:
    model: str
    backend: str
    ngl: str
    dev: str
    test: str
    tps: float


_TPS = re.compile(r"^\s*([0-9.]+)")


def parse_llama_bench(text: str) -> list[BenchRow]:
    """Rows of llama-bench's markdown table, found by header names (columns vary by version)."""
    rows: list[BenchRow] = []
    header: list[str] | None = None
    for line in text.splitlines():
        s = line.strip()
        if not (s.startswith("|") and s.endswith("|")):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if "model" in cells and "test" in cells:
            header = cells
            continue
        if header is None or set("".join(cells)) <= set("-: "):
            continue
        if len(cells) != len(header):
            continue
        rec = dict(zip(header, cells, strict=True))
        m = _TPS.match(rec.get("t/s", ""))
        if not m:
            continue
        rows.append(
            BenchRow(
                rec.get("model", ""),
                rec.get("backend", ""),
                rec.get("ngl", ""),
                rec.get("dev", rec.get("device", "")),
                rec.get("test", ""),
                float(m.group(1)),
            )
        )
    return rows


def _pp(rows: list[BenchRow]) -> BenchRow | None:
    return next((r for r in rows if r.test.startswith("pp")), None)


def venus_checks(vulkaninfo: str, gpu_bench: str, cpu_bench: str) -> list[Check]:
    checks: list[Check] = []
    devices = parse_vulkaninfo_summary(vulkaninfo)
    apple = [d for d in devices if d.venus and re.search(r"Venus \(Apple ", d.name)]
    listing = "; ".join(f"{d.name} [{d.driver_id}]" for d in devices) or "no devices"
    if apple:
        checks.append(Check("venus.device", "ok", f"{apple[0].name}"))
    else:
        checks.append(
            Check(
                "venus.device",
                "fail",
                f"no Venus device on the Apple GPU: {listing}",
                "run `provision doctor --guest-image localhost/krun-gpu/llama:latest`",
            )
        )
    gpu, cpu = _pp(parse_llama_bench(gpu_bench)), _pp(parse_llama_bench(cpu_bench))
    if gpu is None or cpu is None:
        which = "GPU" if gpu is None else "CPU"
        checks.append(
            Check(
                "venus.speedup",
                "fail",
                f"no pp row in the {which} llama-bench output",
                "see the saved llama-bench output",
            )
        )
        return checks
    if gpu.dev and gpu.dev != "Vulkan0":
        checks.append(
            Check("venus.speedup", "fail", f"GPU run used device {gpu.dev}, not Vulkan0", "pass -dev Vulkan0")
        )
        return checks
    ratio = gpu.tps / cpu.tps if cpu.tps > 0 else float("inf")
    ev = (
        f"{gpu.test}: Vulkan0 {gpu.tps:.1f} t/s vs CPU {cpu.tps:.1f} t/s = {ratio:.2f}x (need >= {MIN_PP_SPEEDUP:.0f}x)"
    )
    checks.append(
        Check(
            "venus.speedup",
            "ok" if ratio >= MIN_PP_SPEEDUP else "fail",
            ev,
            None if ratio >= MIN_PP_SPEEDUP else "check that -ngl 99 -dev Vulkan0 reached Venus",
        )
    )
    return checks


def apir_checks(bench: str) -> list[Check]:
    rows = parse_llama_bench(bench)
    if not rows:
        return [Check("apir.backend", "fail", "no llama-bench table in the output", "see the saved output")]
    backends = sorted({r.backend for r in rows})
    if all("ggml-virtgpu" in r.backend for r in rows):
        pp = _pp(rows)
        extra = f"; {pp.test} {pp.tps:.1f} t/s" if pp else ""
        return [Check("apir.backend", "ok", f"backend {', '.join(backends)}{extra}")]
    return [
        Check(
            "apir.backend",
            "fail",
            f"llama-bench reports backend {', '.join(backends)}, not ggml-virtgpu",
            "launch with `provision launch --route apir` and run the llama-apir stack with --gpu",
        )
    ]


_TOGETHER = re.compile(r"^== (first|second) \(exit (\d+)\)$", re.M)


def apir_together_check(text: str) -> Check:
    """Two llama-bench processes of one guest at once (checks/macos-apir): each is a virgl context of its own,
    and krunkit serves them all in its one process. The host library shares its backend between them since
    patch 0020; without it the second was refused (ALREADY_INITED) and the first to exit freed the other's
    buffers."""
    marks = list(_TOGETHER.finditer(text))
    if [m[1] for m in marks] != ["first", "second"]:
        return Check("apir.two-processes", "fail", "the output has no '== first' and '== second' sections",
                     "see the saved output")
    ran: list[str] = []
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        rows = parse_llama_bench(text[mark.end():end])
        pp = _pp(rows)
        if mark[2] != "0" or not rows or not all("ggml-virtgpu" in r.backend for r in rows) or pp is None:
            return Check("apir.two-processes", "fail",
                         f"the {mark[1]} of two guest processes at once exited {mark[2]} "
                         f"{'with' if rows else 'without'} a ggml-virtgpu table",
                         "upgrade the krun bundle (nix profile upgrade): its libggml-virtgpu-backend must carry "
                         "patch 0020, which lets krunkit serve several guest processes at once")
        ran.append(f"{pp.test} {pp.tps:.1f} t/s")
    return Check("apir.two-processes", "ok", f"two guest processes at once on ggml-virtgpu: {' and '.join(ran)}")


def report(route: str, checks: list[Check], facts: str = "") -> str:
    verdict = "FAIL" if failed(checks) else "PASS"
    lines = [
        f"### krun-gpu macOS {route} check: {verdict}",
        "",
        f"- host: {platform.platform()} ({platform.machine()})",
    ]
    lines += [f"- {line}" for line in facts.strip().splitlines() if line.strip()]
    lines += ["", "| status | check | evidence |", "| --- | --- | --- |"]
    lines += [f"| {c.status} | {c.id} | {c.evidence.replace('|', '/')} |" for c in checks]
    return "\n".join(lines) + "\n"

