"""Stopgap tiny llama GGUF for the Linux e2e tests until the model store (`tiny-llama`) is merged.

Random F16 weights, SentencePiece-style vocabulary of 512 tokens, 2 layers: llama.cpp
loads it, and greedy decoding is deterministic, which is all the e2e tests need.
"""

from __future__ import annotations

from pathlib import Path


def write_tiny_llama(dest: Path, seed: int = 0) -> Path:
    import gguf
    import numpy as np

    vocab, embd, ff, layers, heads = 512, 128, 256, 2, 4
    rng = np.random.default_rng(seed)
    tmp = dest.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name("krun-gpu-e2e-tiny")
    w.add_context_length(256)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(ff)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embd // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    w.add_tokenizer_model("llama")
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    words = ["\u2581t" + str(i) for i in range(vocab - len(specials) - len(byte_tokens))]
    w.add_token_list(specials + byte_tokens + words)
    w.add_token_scores([0.0] * (len(specials) + len(byte_tokens)) + [-float(i) for i in range(len(words))])
    w.add_token_types([2, 3, 3] + [6] * len(byte_tokens) + [1] * len(words))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def tensor(name: str, shape: tuple[int, ...], half: bool = True) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float16 if half else np.float32))

    tensor("token_embd.weight", (vocab, embd))
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (embd,), half=False)
        tensor(f"blk.{i}.ffn_norm.weight", (embd,), half=False)
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{i}.{part}.weight", (embd, embd))
        tensor(f"blk.{i}.ffn_gate.weight", (ff, embd))
        tensor(f"blk.{i}.ffn_up.weight", (ff, embd))
        tensor(f"blk.{i}.ffn_down.weight", (embd, ff))
    tensor("output_norm.weight", (embd,), half=False)
    tensor("output.weight", (vocab, embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(dest)
    return dest
