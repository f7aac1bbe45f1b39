"""Synthetic models: tiny random GGUFs that llama.cpp loads, written byte-for-byte reproducibly.

The bytes depend on the exact ``gguf`` and ``numpy`` versions (tensor layout, padding, the
random generator), so both are pinned in pins.json "python" and checked before writing: an
unpinned version would produce bytes that do not match the catalog's sha256.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from provision.core.errors import ToolMissing, UnknownModel
from provision.core.pins import Pins
from provision.models.synth_llama import add_spm_vocab, write_llama_kquant, write_out
from provision.models.synth_qwen2 import write_qwen2_shape


@dataclass(frozen=True)
class LlamaShape:
    """Small enough to build in a blink, shaped like a real llama (GQA off, SPM vocab)."""

    vocab: int = 512
    embd: int = 128
    ff: int = 256
    layers: int = 2
    heads: int = 4
    ctx: int = 256
    seed: int = 0


def check_versions(pins: Pins) -> None:
    for package, wanted in pins.python.items():
        try:
            found = metadata.version(package)
        except metadata.PackageNotFoundError:
            found = None
        if found != wanted:
            have = f"{package} {found} is installed" if found else f"{package} is not installed"
            raise ToolMissing(
                f"synthetic models need {package}=={wanted} ({pins.path} python.{package}), but {have}: "
                "other versions write other bytes",
                fix=f"pip install '{package}=={wanted}' (or: pip install 'krun-gpu[synth]')",
            )


def write_tiny_llama(path: Path, shape: LlamaShape = LlamaShape()) -> None:
    import gguf  # the [synth] extra; imported here so the rest of provision works without it
    import numpy as np

    rng = np.random.default_rng(shape.seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(shape.ctx)
    writer.add_embedding_length(shape.embd)
    writer.add_feed_forward_length(shape.ff)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.heads)
    writer.add_rope_dimension_count(shape.embd // shape.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # mostly F16

    add_spm_vocab(writer, shape.vocab)

    def tensor(name: str, dims: tuple[int, ...], dtype: type = np.float16) -> None:
        writer.add_tensor(name, (rng.standard_normal(dims) * 0.02).astype(dtype))

    tensor("token_embd.weight", (shape.vocab, shape.embd))
    for layer in range(shape.layers):
        blk = f"blk.{layer}"
        tensor(f"{blk}.attn_norm.weight", (shape.embd,), np.float32)
        tensor(f"{blk}.ffn_norm.weight", (shape.embd,), np.float32)
        for proj in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"{blk}.{proj}.weight", (shape.embd, shape.embd))
        tensor(f"{blk}.ffn_gate.weight", (shape.ff, shape.embd))
        tensor(f"{blk}.ffn_up.weight", (shape.ff, shape.embd))
        tensor(f"{blk}.ffn_down.weight", (shape.embd, shape.ff))
    tensor("output_norm.weight", (shape.embd,), np.float32)
    tensor("output.weight", (shape.vocab, shape.embd))

    write_out(writer)


GENERATORS: dict[str, Callable[[Path], None]] = {
    "tiny-llama": write_tiny_llama,
    "llama-kquant": write_llama_kquant,
    "qwen2-0.5b-shape": write_qwen2_shape,
}


def generator(kind: str) -> Callable[[Path], None]:
    try:
        return GENERATORS[kind]
    except KeyError:
        raise UnknownModel(f"no synthetic model {kind!r} (known: {', '.join(sorted(GENERATORS))})") from None
