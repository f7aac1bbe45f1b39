"""A synthetic model of real size: Qwen2.5-0.5B's shape and its Q4_K_M tensor layout, random weights.

For speed measurements where the model's size matters (a GPU's per-token cost, a VM's
remoting cost against it), without downloading anything: written where it runs, in seconds.
The shape is Qwen2.5-0.5B's (architecture ``qwen2``: 24 layers, 896 embd, 4864 ff, 14 heads /
2 KV heads of 64, Q/K/V biases, tied embeddings, rope base 1e6, 151936 tokens: 494 M
parameters). The layout is what llama.cpp's quantizer gives that model at Q4_K_M: 896 is no
multiple of 256, so the 896-wide rows fall back from the k-quants (q4_K -> q5_0, q6_K -> q8_0);
only ffn_down (4864 wide) keeps q4_K / q6_K. Layers with ``use_more_bits`` (the first and last
eighth, then every third) get q8_0 attn_v and q6_K ffn_down, as llama-quant.cpp chooses.

Quantized blocks are random bytes with a fixed scale (as synth_llama.py does for the k-quants):
writing 494 M parameters takes seconds, not the minutes quantizing floats would. The vocabulary
is SentencePiece-style (synth_llama.add_spm_vocab), sized like Qwen's; speed does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.models.synth_llama import add_spm_vocab, q4_k_blocks, q6_k_blocks, write_out

QK = 32  # values per q5_0 / q8_0 block
Q5_0_BYTES = 2 + 4 + 16  # d, qh[4], qs[16]
Q8_0_BYTES = 2 + 32  # d, qs[32]


@dataclass(frozen=True)
class Qwen2Shape:
    vocab: int = 151936
    embd: int = 896
    ff: int = 4864
    layers: int = 24
    heads: int = 14
    heads_kv: int = 2
    ctx: int = 32768
    seed: int = 2

    def parameters(self) -> int:
        head_dim = self.embd // self.heads
        kv = head_dim * self.heads_kv
        attn = 2 * self.embd * self.embd + 2 * kv * self.embd + self.embd + 2 * kv
        per_layer = attn + 3 * self.embd * self.ff + 2 * self.embd
        return self.vocab * self.embd + self.layers * per_layer + self.embd


def use_more_bits(layer: int, layers: int) -> bool:
    """llama-quant.cpp's choice of the layers that get more bits at Q4_K_M."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def q5_0_blocks(rng: Any, rows: int, cols: int, std: float) -> Any:
    """Random block_q5_0 rows: w = d * (q - 16), q 5-bit uniform (spread about 9.2 * d)."""
    import numpy as np

    nb = rows * cols // QK
    raw = rng.integers(0, 256, size=(nb, Q5_0_BYTES), dtype=np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(std / 9.2).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // QK * Q5_0_BYTES)


def q8_0_blocks(rng: Any, rows: int, cols: int, std: float) -> Any:
    """Random block_q8_0 rows: w = d * q, q int8 uniform (spread about 73.9 * d)."""
    import numpy as np

    nb = rows * cols // QK
    raw = rng.integers(0, 256, size=(nb, Q8_0_BYTES), dtype=np.uint8)
    raw[:, 0:2] = np.frombuffer(np.float16(std / 73.9).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // QK * Q8_0_BYTES)


def layout(shape: Qwen2Shape) -> dict[str, str]:
    """Tensor name -> ggml type name, as Q4_K_M lays the model out."""
    out = {"token_embd.weight": "q8_0"}
    for layer in range(shape.layers):
        blk, more = f"blk.{layer}", use_more_bits(layer, shape.layers)
        for proj in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"):
            out[f"{blk}.{proj}.weight"] = "q5_0"
        out[f"{blk}.attn_v.weight"] = "q8_0" if more else "q5_0"
        out[f"{blk}.ffn_down.weight"] = "q6_K" if more else "q4_K"
    return out


def write_qwen2_shape(path: Path, shape: Qwen2Shape = Qwen2Shape()) -> None:
    import gguf
    import numpy as np

    rng = np.random.default_rng(shape.seed)
    qt = gguf.GGMLQuantizationType
    kinds = layout(shape)
    head_dim = shape.embd // shape.heads
    kv_dim = head_dim * shape.heads_kv
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("synthetic-qwen2.5-0.5b-shape")
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.embd)
    writer.add_feed_forward_length(shape.ff)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads_kv)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    add_spm_vocab(writer, shape.vocab)

    makers = {"q5_0": (q5_0_blocks, qt.Q5_0), "q8_0": (q8_0_blocks, qt.Q8_0),
              "q4_K": (q4_k_blocks, qt.Q4_K), "q6_K": (q6_k_blocks, qt.Q6_K)}

    def weight(name: str, rows: int, cols: int, std: float) -> None:
        make, raw_dtype = makers[kinds[name]]
        writer.add_tensor(name, make(rng, rows, cols, std), raw_dtype=raw_dtype)

    def f32(name: str, n: int, mean: float, std: float) -> None:
        writer.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

    weight("token_embd.weight", shape.vocab, shape.embd, 0.5)  # tied: also the output projection
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        f32(f"{blk}.attn_norm.weight", shape.embd, 1.0, 0.1)
        weight(f"{blk}.attn_q.weight", shape.embd, shape.embd, 0.05)
        f32(f"{blk}.attn_q.bias", shape.embd, 0.0, 0.02)
        weight(f"{blk}.attn_k.weight", kv_dim, shape.embd, 0.05)
        f32(f"{blk}.attn_k.bias", kv_dim, 0.0, 0.02)
        weight(f"{blk}.attn_v.weight", kv_dim, shape.embd, 0.05)
        f32(f"{blk}.attn_v.bias", kv_dim, 0.0, 0.02)
        weight(f"{blk}.attn_output.weight", shape.embd, shape.embd, 0.03)
        f32(f"{blk}.ffn_norm.weight", shape.embd, 1.0, 0.1)
        weight(f"{blk}.ffn_gate.weight", shape.ff, shape.embd, 0.05)
        weight(f"{blk}.ffn_up.weight", shape.ff, shape.embd, 0.05)
        weight(f"{blk}.ffn_down.weight", shape.embd, shape.ff, 0.03)
    f32("output_norm.weight", shape.embd, 1.0, 0.1)
    write_out(writer)
