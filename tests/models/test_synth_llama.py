"""The realistic synthetic llama (llama-kquant): byte-identical to its pin, and its tensors
decode (through gguf's own k-quant dequantizers) to finite weights of the designed spread,
in every weight type the APIR op list covers."""

from __future__ import annotations

import hashlib

import gguf  # the [synth] extra
import numpy as np
import pytest

from provision import cli
from provision.apir import ops as apir_ops
from provision.core import pins


def test_llama_kquant_is_byte_identical_to_its_pin(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert cli.main(["model", "synth", "llama-kquant", "--output", str(a)]) == 0
    assert cli.main(["model", "synth", "llama-kquant", "--output", str(b)]) == 0
    pin = pins.default().models["llama-kquant"]
    assert a.read_bytes() == b.read_bytes()
    assert hashlib.sha256(a.read_bytes()).hexdigest() == pin.sha256
    assert a.stat().st_size == pin.size


def test_llama_kquant_has_realistic_shapes_and_every_weight_type(tmp_path):
    path = tmp_path / "m.gguf"
    assert cli.main(["model", "synth", "llama-kquant", "--output", str(path)]) == 0
    reader = gguf.GGUFReader(str(path))
    fields = {f.name: f for f in reader.fields.values()}
    assert int(fields["llama.block_count"].parts[-1][0]) == 4
    assert int(fields["llama.embedding_length"].parts[-1][0]) == 256
    assert int(fields["llama.attention.head_count_kv"].parts[-1][0]) == 2
    types = {t.tensor_type.name.lower().replace("q4_k", "q4_K").replace("q6_k", "q6_K") for t in reader.tensors}
    assert set(apir_ops.WEIGHT_TYPES) <= types
    spreads = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name
        spreads[t.name] = float(values.std())
    assert spreads["token_embd.weight"] == pytest.approx(1.0, rel=0.1)
    assert spreads["output.weight"] == pytest.approx(0.5, rel=0.1)
    assert spreads["blk.0.attn_q.weight"] == pytest.approx(0.08, rel=0.1)
    assert spreads["blk.0.ffn_down.weight"] == pytest.approx(0.05, rel=0.1)
