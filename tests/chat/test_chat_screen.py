"""What chat shows of a model's text: no escape sequences or control bytes reach the terminal, in
whatever pieces the stream cuts them, while newlines and tabs stay and the history keeps the raw text."""

from __future__ import annotations

import io
import json

import pytest

from provision.chat.screen import Screen, shown
from provision.chat.session import Session
from tests.chat.sse_server import Server
from tests.helpers import run_provision

CASES = [
    ("plain words\nand\ttabs", "plain words\nand\ttabs"),
    ("\x1b[1;31mred\x1b[0m", "red"),  # CSI (SGR)
    ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home
    ("\x1b]0;title\x07t", "t"),  # OSC ended by BEL
    ("\x1b]52;c;aGk=\x1b\\clip", "clip"),  # OSC 52 (clipboard) ended by ST
    ("\x1bP1$r\x1b\\x", "x"),  # DCS
    ("\x1b7\x1b8ok", "ok"),  # two-byte escapes
    ("\x9b31mc1\x9b0m", "c1"),  # 8-bit CSI
    ("\x9d0;t\x9cz", "z"),  # 8-bit OSC and ST
    ("v\x0bt\x10p\x7f\x85", "v\\x0bt\\x10p\\x7f\\x85"),  # other controls shown, not acted on
    ("line\r\nnext", "line\nnext"),  # CR LF is a line end
    ("over\rwrite", "over\\x0dwrite"),  # a lone CR would rewrite the line
    ("end\r", "end\\x0d"),
    ("esc\x1b\nnl", "esc\nnl"),  # ESC before a newline: the newline stays
    ("open \x1b]0;never ended", "open "),  # a sequence still open at the end is dropped
    ("ünïcödé ✓ 模型", "ünïcödé ✓ 模型"),
]


@pytest.mark.parametrize("raw,want", CASES)
def test_escape_sequences_go_and_other_controls_are_shown_escaped(raw: str, want: str) -> None:
    assert shown(raw) == want


@pytest.mark.parametrize("raw,want", CASES)
def test_the_same_in_any_cut_of_the_stream(raw: str, want: str) -> None:
    for cut in range(len(raw) + 1):
        screen = Screen()
        assert screen.feed(raw[:cut]) + screen.feed(raw[cut:]) + screen.flush() == want, cut
    screen = Screen()
    assert "".join(screen.feed(ch) for ch in raw) + screen.flush() == want


class Pieces:
    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def stream(self, messages: object, *, max_tokens: int | None, temperature: float | None) -> list[str]:
        return self.pieces


def test_the_session_shows_text_and_keeps_the_raw_reply() -> None:
    out = io.StringIO()
    pieces = ["hi \x1b[3", "1mred\x1b", "[0m \x1b]52;c;", "aGk=\x07done\x0b"]
    session = Session(Pieces(pieces), out)
    assert session.ask("q") == "".join(pieces)
    assert out.getvalue() == "hi red done\\x0b"
    assert session.history[-1]["content"] == "".join(pieces)


def test_provision_chat_prints_no_control_bytes() -> None:
    # The loopback server answers with the prompt's words reversed, so the prompt carries what the model "says".
    prompt = "\x1b[31mred\x1b[0m \x1b]52;c;aGk=\x07clip \x10vt"
    with Server() as server:
        proc = run_provision("chat", server.url, "--prompt", prompt)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "[1] \\x10vt clip red\n"
        proc = run_provision("chat", server.url, "--prompt", prompt, "--json")
        assert proc.returncode == 0, proc.stderr
        raw = json.loads(proc.stdout)["data"]["message"]["content"]  # the JSON carries the reply as sent
        assert raw == "[1] \x10vt \x1b]52;c;aGk=\x07clip \x1b[31mred\x1b[0m"
        assert "\x1b" not in proc.stderr and "\x10" not in proc.stderr
