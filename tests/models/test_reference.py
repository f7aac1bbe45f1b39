"""The float64 reference that judges greedy text from ggml backends (checks/linux-apir)."""

from __future__ import annotations

from provision import cli
from provision.models import reference as ref


def _steps(*tokens_margins: tuple[int, float]) -> list[ref.Step]:
    return [ref.Step(t, 0, m, 8.0) for t, m in tokens_margins]


def test_prompt_is_bos_and_one_byte_token_per_byte_as_llama_cpp_tokenizes_it():
    assert ref.prompt_tokens("w1 w2") == [1] + [3 + b for b in "\u2581w1\u2581w2".encode()]


def test_render_prints_words_with_a_space_and_byte_tokens_raw():
    assert ref.render([ref.WORD_BASE + 475, ref.BYTE_BASE + 0xAF, ref.WORD_BASE + 52]) == b" w475\xaf w52"


def test_judge_finds_the_step_where_text_departs_and_its_margin():
    steps = _steps((ref.WORD_BASE + 5, 3.0), (ref.WORD_BASE + 7, 0.2), (ref.BYTE_BASE + 0x43, 1.0))
    assert ref.judge(b" w5 w7C", steps) == ref.Verdict(True, None, None)
    assert ref.judge(b" w5 w8C", steps) == ref.Verdict(False, 2, 0.2)
    # " w5" is not the start of " w52": the first step already differs.
    assert ref.judge(b" w52 w7C", steps) == ref.Verdict(False, 1, 3.0)
    # Text longer than the reference is not equal either.
    assert ref.judge(b" w5 w7C w9", steps).equal is False


def test_greedy_on_llama_kquant_picks_the_argmax_with_positive_margins(tmp_path):
    path = tmp_path / "m.gguf"
    assert cli.main(["model", "synth", "llama-kquant", "--output", str(path)]) == 0
    model = ref.load(path)
    assert (model.layers, model.heads, model.heads_kv) == (4, 4, 2)
    steps = ref.greedy(model, ref.prompt_tokens("w1 w2 w3 w4"), 6)
    assert all(s.margin > 0 and s.token != s.runner_up and s.spread > 1 for s in steps)
    # Decoding fewer steps is a prefix: the KV cache grows as the tokens do.
    assert [s.token for s in ref.greedy(model, ref.prompt_tokens("w1 w2 w3 w4"), 3)] == [s.token for s in steps[:3]]
    assert ref.judge(ref.render([s.token for s in steps]), steps).equal
