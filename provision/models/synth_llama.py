"""A synthetic llama closer to real use: 4 layers, 256 dims, GQA, k-quant weights.

Shaped like a small Q4_K_M model: most projections q4_K, attn_v / ffn_down / output q6_K,
and one layer each in q8_0, q4_0 and f16 so a forward pass runs every weight type our
models use (f16, q8_0, q4_0, q4_K, q6_K) through GET_ROWS and MUL_MAT. gguf-py quantizes
q8_0 and q4_0 but not the k-quants, so those blocks are written directly: random quant
values and scales with fixed super-block scales, i.e. random weights of a chosen spread,
stored exactly as ggml's block_q4_K / block_q6_K lay them out.

The output projection is given a wide spread on purpose: greedy decoding then has clear
margins between the top logits, so the APIR device and the guest CPU (whose float orders
differ) pick the same tokens, which is what the end-to-end check compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

QK_K = 256
# Bytes per 256-value super-block (ggml-common.h): d, dmin, scales[12], qs[128] / ql[128], qh[64], scales[16], d.
Q4_K_BYTES = 2 + 2 + 12 + 128
Q6_K_BYTES = 128 + 64 + 16 + 2


@dataclass(frozen=True)
class KQuantShape:
    vocab: int = 1024
    embd: int = 256
    ff: int = 768
    layers: int = 4
    heads: int = 4
    heads_kv: int = 2
    ctx: int = 512
    seed: int = 1


def add_spm_vocab(writer: Any, vocab: int) -> None:
    """A SentencePiece-style vocabulary: unk/bos/eos controls, 256 byte tokens, then plain words."""
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    words = [f"\u2581w{i}" for i in range(vocab - len(specials) - len(byte_tokens))]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(specials + byte_tokens + words)
    writer.add_token_scores([0.0] * (len(specials) + len(byte_tokens)) + [-float(i) for i in range(len(words))])
    # token types: 2 unknown, 3 control, 6 byte, 1 normal
    writer.add_token_types([2, 3, 3] + [6] * len(byte_tokens) + [1] * len(words))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)


def write_out(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def q4_k_blocks(rng: Any, rows: int, cols: int, std: float) -> Any:
    """Random block_q4_K rows: w = d*sc*q - dmin*m, q in 0..15, sc/m 6-bit; about N(0, std)."""
    import numpy as np

    nb = rows * cols // QK_K
    raw = rng.integers(0, 256, size=(nb, Q4_K_BYTES), dtype=np.uint8)
    # 261 * d is the spread of d*sc*q - dmin*m with uniform sc, m, q and dmin = 7.5 * d.
    d = np.float16(std / 261.0)
    raw[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    raw[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // QK_K * Q4_K_BYTES)


def q6_k_blocks(rng: Any, rows: int, cols: int, std: float) -> Any:
    """Random block_q6_K rows: w = d*scale*(q - 32), q 6-bit, scale int8 in 16..63."""
    import numpy as np

    nb = rows * cols // QK_K
    raw = rng.integers(0, 256, size=(nb, Q6_K_BYTES), dtype=np.uint8)
    raw[:, 192:208] = rng.integers(16, 64, size=(nb, 16), dtype=np.uint8)
    # E[scale^2]^0.5 ~ 42, std(q - 32) ~ 18.5: the spread is about 780 * d.
    raw[:, 208:210] = np.frombuffer(np.float16(std / 780.0).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, cols // QK_K * Q6_K_BYTES)


def write_llama_kquant(path: Path, shape: KQuantShape = KQuantShape()) -> None:
    import gguf
    import numpy as np

    rng = np.random.default_rng(shape.seed)
    qt = gguf.GGMLQuantizationType
    head_dim = shape.embd // shape.heads
    kv_dim = head_dim * shape.heads_kv
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("synthetic-llama-kquant")
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.embd)
    writer.add_feed_forward_length(shape.ff)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads_kv)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M

    add_spm_vocab(writer, shape.vocab)

    def weight(name: str, rows: int, cols: int, kind: str, std: float) -> None:
        if kind == "q4_K":
            writer.add_tensor(name, q4_k_blocks(rng, rows, cols, std), raw_dtype=qt.Q4_K)
        elif kind == "q6_K":
            writer.add_tensor(name, q6_k_blocks(rng, rows, cols, std), raw_dtype=qt.Q6_K)
        else:
            values = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
            if kind == "f16":
                writer.add_tensor(name, values.astype(np.float16))
            else:
                q = qt.Q8_0 if kind == "q8_0" else qt.Q4_0
                writer.add_tensor(name, gguf.quants.quantize(values, q), raw_dtype=q)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(shape.embd)).astype(np.float32))

    # The attention projections of layers 1-3 take the other weight types.
    attn_kind = {1: "q8_0", 2: "q4_0", 3: "f16"}
    weight("token_embd.weight", shape.vocab, shape.embd, "q4_K", 1.0)
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        kind = attn_kind.get(layer, "q4_K")
        norm(f"{blk}.attn_norm.weight")
        weight(f"{blk}.attn_q.weight", shape.embd, shape.embd, kind, 0.08)
        weight(f"{blk}.attn_k.weight", kv_dim, shape.embd, kind, 0.08)
        weight(f"{blk}.attn_v.weight", kv_dim, shape.embd, "q6_K", 0.08)
        weight(f"{blk}.attn_output.weight", shape.embd, shape.embd, kind, 0.05)
        norm(f"{blk}.ffn_norm.weight")
        weight(f"{blk}.ffn_gate.weight", shape.ff, shape.embd, "q4_K", 0.08)
        weight(f"{blk}.ffn_up.weight", shape.ff, shape.embd, "q4_K", 0.08)
        weight(f"{blk}.ffn_down.weight", shape.embd, shape.ff, "q6_K", 0.05)
    norm("output_norm.weight")
    weight("output.weight", shape.vocab, shape.embd, "q6_K", 0.5)

    write_out(writer)
