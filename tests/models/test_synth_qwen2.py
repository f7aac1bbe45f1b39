"""The model of real size (qwen2-0.5b-shape): Qwen2.5-0.5B's shape and parameter count, the tensor
types llama.cpp's Q4_K_M gives that model, weights that decode (gguf's own dequantizers) to finite
values of the designed spread, and the same bytes on every write."""

from __future__ import annotations

import collections
import hashlib

import gguf  # the [synth] extra
import numpy as np
import pytest

from provision import cli
from provision.models import synth_qwen2

# Qwen2.5-0.5B: 494,032,768 parameters (its model card rounds to 0.49 B).
QWEN25_05B_PARAMETERS = 494_032_768


def test_the_real_size_model_has_qwen25_05bs_shape_and_its_q4_k_m_layout(tmp_path):
    path = tmp_path / "q.gguf"
    assert cli.main(["model", "synth", "qwen2-0.5b-shape", "--output", str(path)]) == 0
    reader = gguf.GGUFReader(str(path))
    fields = {f.name: f for f in reader.fields.values()}
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen2"
    assert int(fields["qwen2.block_count"].parts[-1][0]) == 24
    assert int(fields["qwen2.embedding_length"].parts[-1][0]) == 896
    assert int(fields["qwen2.attention.head_count_kv"].parts[-1][0]) == 2
    assert len(fields["tokenizer.ggml.tokens"].data) == 151936
    assert sum(int(t.n_elements) for t in reader.tensors) == QWEN25_05B_PARAMETERS
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors)
    assert counts == {"Q5_0": 132, "Q8_0": 13, "Q4_K": 12, "Q6_K": 12, "F32": 121}
    assert "output.weight" not in {t.name for t in reader.tensors}  # tied, as in Qwen2.5-0.5B
    by_name = {t.name: t for t in reader.tensors}
    for name, std in (
        ("token_embd.weight", 0.5),
        ("blk.0.attn_q.weight", 0.05),
        ("blk.0.attn_v.weight", 0.05),
        ("blk.3.attn_v.weight", 0.05),
        ("blk.0.ffn_down.weight", 0.03),
        ("blk.3.ffn_down.weight", 0.03),
    ):
        values = gguf.quants.dequantize(by_name[name].data, by_name[name].tensor_type)
        assert np.isfinite(values).all() and float(values.std()) == pytest.approx(std, rel=0.15), name
    assert path.stat().st_size > 350 * 2**20  # a real model's weight, not a toy's


def test_same_bytes_on_every_write_and_the_shapes_count_is_the_files(tmp_path):
    small = synth_qwen2.Qwen2Shape(vocab=2048, layers=3, ff=512)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    synth_qwen2.write_qwen2_shape(a, small)
    synth_qwen2.write_qwen2_shape(b, small)
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    reader = gguf.GGUFReader(str(a))
    assert sum(int(t.n_elements) for t in reader.tensors) == small.parameters()
