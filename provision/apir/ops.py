"""The ops a llama graph runs, as data, and the reading of test-backend-ops' output for them.

The list is what llama.cpp (pinned tree, src/models/llama.cpp + src/llama-graph.cpp +
src/llama-kv-cache.cpp) builds for LLM_ARCH_LLAMA with the weight types our models use
(f16, q8_0, q4_0, q4_K, q6_K): the embedding and output-row lookups, the norms, the
projections, RoPE, the KV-cache stores, attention (soft-max or flash), the SwiGLU FFN and the
residual adds. VIEW/RESHAPE/PERMUTE/TRANSPOSE only re-describe memory; the backends run
them as no-ops, and test-backend-ops has no case for them on their own.

Each entry names the test-backend-ops op (``-o``, matched against ggml_op_desc) and a
parameter filter (``-p``, a regex over the case's parameters) that keeps the cases to the
types and shapes a llama graph uses: every case of an op under TCG costs a CPU reference.

"N/M tests passed" counts the cases the device ran (supported ones); "2/2 backends passed"
is printed even when the device was skipped, so a check asserts N > 0 and N == M per op.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

WEIGHT_TYPES = ("f16", "q8_0", "q4_0", "q4_K", "q6_K")
_W = "|".join(WEIGHT_TYPES)


@dataclass(frozen=True)
class Op:
    name: str  # test-backend-ops -o
    where: str  # what in the llama graph builds it
    params: str | None = None  # test-backend-ops -p (regex over the case's parameters)


LLAMA_OPS: tuple[Op, ...] = (
    Op("GET_ROWS", "token embedding lookup (weight type) and inp_out_ids (f32)",
       rf"type=(f32|{_W}),n=256,m=5,r=4,"),
    Op("RMS_NORM", "attn_norm, ffn_norm, output_norm", r"type=f32,ne=\[64,5,4,3\]"),
    Op("MUL", "norm weights", r"type=f32,ne=\[10,5,4,3\]"),
    Op("ADD", "residual stream", r"type=f32,ne=\[10,5,4,3\]"),
    Op("MUL_MAT", "q/k/v/o and ffn projections, output, KQ and KQV",
       rf"type_a=({_W}),type_b=f32,m=16,n=(1|9),k=256,bs=\[1,1\],nr=\[1,1\]"),
    Op("ROPE", "rope_ext on Q and K (LLAMA_ROPE_TYPE_NORM)", r"type=f32,ne_a=\[128,32,2,1\],n_dims=128,mode=0,"),
    Op("SET_ROWS", "KV cache store (f32 rows into the f16 cache)", r"type_src=f32,type_dst=f16,type_idx=i64,"),
    # 16-wide cases include sinks without a mask: a gap in the sources the guest must refuse.
    Op("SOFT_MAX", "attention softmax (soft_max_ext with mask and scale)", r"type=f32,ne=\[(16|32|64),"),
    Op("FLASH_ATTN_EXT", "attention with flash_attn on (f16 KV cache)",
       r"hsk=(64|128),hsv=(64|128),nh=4,nr23=\[1,1\],kv=\d+,nb=(1|3),mask=1,sinks=0,max_bias=0\.0+,"
       r"logit_softcap=0\.0+,prec=f32,type_K=f16,type_V=f16,permute=\[0,1,2,3\]"),
    Op("CPY", "casts between the f32 activations and f16",
       r"type_src=(f32|f16),type_dst=(f32|f16),ne_src=\[256,4,4,4\]"),
    Op("CONT", "kqv after permute (cont_2d)", r"type=f32,"),
    Op("SWIGLU", "FFN gate: swiglu_split(gate, up)", r"type=f32,"),
    Op("SCALE", "scaling (kq_scale where not fused)", None),
)


def by_name() -> dict[str, Op]:
    return {op.name: op for op in LLAMA_OPS}


def tbo_argv(op: Op, device: str, *, binary: str = "test-backend-ops") -> list[str]:
    argv = [binary, "test", "-b", device, "-o", op.name]
    if op.params:
        argv += ["-p", op.params]
    return argv


def tbo_shell(op: Op, device_var: str = '"$DEV"', binary: str = "test-backend-ops") -> str:
    """The command line for a guest shell script, where the device is a shell variable."""
    argv = tbo_argv(op, "@DEV@", binary=binary)
    return " ".join(device_var if a == "@DEV@" else shlex.quote(a) for a in argv)


_CASE = re.compile(r"^  ([A-Z_0-9]+)\((.*)\): (.*)$")
_PASSED = re.compile(r"^  (\d+)/(\d+) tests passed$", re.M)
_BACKEND = re.compile(r"^Backend \d+/\d+: (.*)$", re.M)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class OpResult:
    op: str
    ran: int  # cases run on the device and compared with the CPU (the "N" of N/M)
    passed: int
    total: int
    unsupported: int  # cases the device refused (the scheduler would run them elsewhere)
    failed: tuple[str, ...]  # parameters of the cases that failed
    finished: bool  # the run reached its summary (no crash, no hang)
    device_tested: bool  # the device was not skipped

    @property
    def ok(self) -> bool:
        return self.finished and self.device_tested and self.ran > 0 and self.passed == self.total and not self.failed

    def summary(self) -> dict[str, object]:
        return {"ran": self.ran, "passed": f"{self.passed}/{self.total}", "unsupported": self.unsupported,
                "failed": list(self.failed[:5]), "finished": self.finished, "ok": self.ok}


def parse(text: str, op: str, device: str) -> OpResult:
    """Read one `test-backend-ops test -b DEVICE -o OP` run; only the DEVICE block counts."""
    text = _ANSI.sub("", text)
    block = ""
    starts = list(_BACKEND.finditer(text))
    for i, start in enumerate(starts):
        if start.group(1).strip() == device:
            end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
            block = text[start.end() : end]
            break
    summary = _PASSED.search(block)
    passed, total = (int(summary.group(1)), int(summary.group(2))) if summary else (0, 0)
    ran = unsupported = 0
    failed: list[str] = []
    for line in block.splitlines():
        case = _CASE.match(line)
        if not case or case.group(1) != op:
            continue
        status = case.group(3).rstrip()
        if status.startswith("not supported"):
            unsupported += 1
        elif status.endswith("OK"):
            ran += 1
        elif "FAIL" in status:
            ran += 1
            failed.append(case.group(2))
    finished = summary is not None and re.search(r"^\s*Backend .*: (OK|FAIL)\s*$", block, re.M) is not None
    skipped = any(line.strip().startswith("Skipping") for line in block.splitlines()[:4])
    return OpResult(op, ran, passed, total, unsupported, tuple(failed), finished, bool(block) and not skipped)
