"""A float64 reference for the synthetic llamas: greedy decoding by plain numpy arithmetic.

Two ggml backends need not pick the same token where the top two logits are nearly tied:
ggml-cpu quantizes activations to q8 for its dot products, ggml-vulkan does not. This
reference decides which pick the exact arithmetic makes, and by how much, so a check can
tell a remoting defect (a device that departs from exact math) from float rounding (a pick
flipped at a near-tie). It reads the GGUF's own weights through gguf-py's dequantizers and
follows llama.cpp's LLM_ARCH_LLAMA graph: RMS norm, RoPE on adjacent pairs (rope type 0),
grouped-query attention with a causal mask, SwiGLU, untied output.

The synthetic vocabulary has byte tokens and whole words "\u2581wN" but no merge pieces, so
llama.cpp's SPM tokenizer turns a prompt into BOS + one byte token per UTF-8 byte of the
"\u2581"-prefixed text; `prompt_tokens` does the same. llama-simple prints a word token as
" wN" and a byte token as its byte; `render` does the same, so texts compare as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOS = 1
BYTE_BASE = 3  # <unk> <s> </s>, then <0x00>..<0xFF>
WORD_BASE = BYTE_BASE + 256


@dataclass(frozen=True)
class Step:
    token: int
    runner_up: int
    margin: float  # logit of token minus logit of runner_up
    spread: float  # standard deviation of that step's logits


@dataclass(frozen=True)
class Model:
    weights: dict[str, Any]
    layers: int
    heads: int
    heads_kv: int
    rope_base: float
    eps: float


def _field(reader: Any, key: str) -> float:
    return float(reader.fields[key].parts[-1][0])


def load(path: Path) -> Model:
    import gguf
    import numpy as np
    from gguf import quants

    reader = gguf.GGUFReader(str(path))
    weights = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        weights[t.name] = quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return Model(weights, int(_field(reader, "llama.block_count")), int(_field(reader, "llama.attention.head_count")),
                 int(_field(reader, "llama.attention.head_count_kv")), _field(reader, "llama.rope.freq_base"),
                 _field(reader, "llama.attention.layer_norm_rms_epsilon"))


def prompt_tokens(text: str) -> list[int]:
    return [BOS] + [BYTE_BASE + b for b in ("\u2581" + text.replace(" ", "\u2581")).encode()]


def render(tokens: list[int]) -> bytes:
    return b"".join(f" w{t - WORD_BASE}".encode() if t >= WORD_BASE else bytes([t - BYTE_BASE]) for t in tokens)


def greedy(model: Model, prompt: list[int], n: int) -> list[Step]:
    import numpy as np

    w, embd = model.weights, model.weights["token_embd.weight"].shape[1]
    head_dim = embd // model.heads
    group = model.heads // model.heads_kv
    freqs = model.rope_base ** (-2.0 * np.arange(head_dim // 2) / head_dim)

    def rms(x: Any, g: Any) -> Any:
        return x / np.sqrt(np.mean(x * x) + model.eps) * g

    def rope(x: Any, pos: int) -> Any:
        c, s = np.cos(pos * freqs), np.sin(pos * freqs)
        out = np.empty_like(x)
        out[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
        out[:, 1::2] = x[:, 0::2] * s + x[:, 1::2] * c
        return out

    keys: list[list[Any]] = [[] for _ in range(model.layers)]
    values: list[list[Any]] = [[] for _ in range(model.layers)]

    def step(token: int, pos: int) -> Any:
        x = w["token_embd.weight"][token].copy()
        for layer in range(model.layers):
            b = f"blk.{layer}."
            h = rms(x, w[b + "attn_norm.weight"])
            q = rope((w[b + "attn_q.weight"] @ h).reshape(model.heads, head_dim), pos)
            keys[layer].append(rope((w[b + "attn_k.weight"] @ h).reshape(model.heads_kv, head_dim), pos))
            values[layer].append((w[b + "attn_v.weight"] @ h).reshape(model.heads_kv, head_dim))
            k, v = np.stack(keys[layer]), np.stack(values[layer])
            out = np.empty((model.heads, head_dim))
            for head in range(model.heads):
                scores = k[:, head // group, :] @ q[head] / np.sqrt(head_dim)
                p = np.exp(scores - scores.max())
                out[head] = (p / p.sum()) @ v[:, head // group, :]
            x = x + w[b + "attn_output.weight"] @ out.reshape(-1)
            h = rms(x, w[b + "ffn_norm.weight"])
            gate, up = w[b + "ffn_gate.weight"] @ h, w[b + "ffn_up.weight"] @ h
            x = x + w[b + "ffn_down.weight"] @ (gate / (1.0 + np.exp(-gate)) * up)
        return w["output.weight"] @ rms(x, w["output_norm.weight"])

    logits = None
    for pos, token in enumerate(prompt):
        logits = step(token, pos)
    steps = []
    for i in range(n):
        assert logits is not None
        first, second = (int(t) for t in np.argsort(-logits)[:2])
        steps.append(Step(first, second, float(logits[first] - logits[second]), float(logits.std())))
        if i + 1 < n:
            logits = step(first, len(prompt) + i)
    return steps


@dataclass(frozen=True)
class Verdict:
    equal: bool  # the text is the reference's, byte for byte
    diverged_at: int | None  # the reference step (1-based) whose token the text departs from
    margin: float | None  # the reference's top-2 margin at that step


def judge(text: bytes, steps: list[Step]) -> Verdict:
    """Where greedy text departs from the reference, and how close the reference's call was there."""
    expected = [render([s.token]) for s in steps]
    offset = 0
    for i, piece in enumerate(expected):
        after = text[offset + len(piece) : offset + len(piece) + 1]
        # " w5" must not pass for the start of " w52".
        if text[offset : offset + len(piece)] != piece or (piece.startswith(b" w") and after.isdigit()):
            return Verdict(False, i + 1, steps[i].margin)
        offset += len(piece)
    return Verdict(offset == len(text), None if offset == len(text) else len(steps) + 1, None)
