"""The chat client and loop against a real SSE server on loopback (tests/chat/sse_server.py):
tokens streamed as they arrive, history kept and cleared, /exit, --prompt/--json one-shot,
errors as E028; and the REPL driven through a real pty."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.chat import client as chat
from provision.chat.session import Session, repl
from provision.core.errors import ChatFailed, InvalidValue
from tests.chat.pty_driver import pty_session
from tests.chat.sse_server import Server
from tests.helpers import run_provision


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def client_for(server: Server) -> chat.ChatClient:
    return chat.ChatClient(chat.target_url(server.url, []), timeout=30)


def test_tokens_arrive_while_the_server_is_still_streaming(server: Server) -> None:
    server.go.clear()  # the server holds after the first piece until we have it
    stream = client_for(server).stream([{"role": "user", "content": "a b c"}], max_tokens=8, temperature=0)
    first = next(stream)
    assert first == "[1]" and not server.finished.is_set()
    server.go.set()
    assert first + "".join(stream) == "[1] c b a"
    body = server.requests[0]
    assert body["stream"] is True and body["model"] == "tiny-test"  # asked /v1/models for the name
    assert body["max_tokens"] == 8 and body["temperature"] == 0


def test_history_is_sent_back_and_clear_forgets_it(server: Server) -> None:
    out = io.StringIO()
    session = Session(client_for(server), out, system="be brief")
    lines = iter(["hello there", "", "/clear", "again", "/nope", "/exit", "never sent"])
    notes: list[str] = []
    turns = repl(session, lambda _prompt: next(lines), notes.append)
    assert turns == 2
    assert [len(r["messages"]) for r in server.requests] == [2, 2]  # system + user, twice: /clear emptied it
    assert server.requests[0]["messages"][0] == {"role": "system", "content": "be brief"}
    assert "(history cleared)" in notes and any("unknown command /nope" in n for n in notes)
    assert out.getvalue() == "[1] there hello\n[1] again\n"


def test_a_second_turn_carries_the_first(server: Server) -> None:
    session = Session(client_for(server), io.StringIO())
    session.ask("one two")
    assert session.ask("three") == "[2] three"
    assert [m["role"] for m in server.requests[1]["messages"]] == ["user", "assistant", "user"]
    assert server.requests[1]["messages"][1]["content"] == "[1] two one"


def test_errors_are_e028_and_leave_the_history_whole(server: Server) -> None:
    session = Session(client_for(server), io.StringIO())
    with pytest.raises(ChatFailed, match="context overflow"):
        session.ask("boom")
    with pytest.raises(ChatFailed, match="500: .*model exploded"):
        session.ask("status500")
    assert session.history == []
    with pytest.raises(ChatFailed, match="cannot reach"):
        list(chat.ChatClient(chat.Target("http://127.0.0.1:9", "m")).stream([], max_tokens=1, temperature=None))


def test_garbage_events_are_e028() -> None:
    with pytest.raises(ChatFailed, match="not JSON"):
        list(chat.deltas(chat.sse_data([b"data: {oops\n"])))
    piece = b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n'
    after = b'data: {"choices":[{"delta":{"content":"z"}}]}\n'
    assert list(chat.deltas(chat.sse_data([b": c\n", b"event: x\n", piece, b"data: [DONE]\n", after]))) == ["a"]


@dataclass
class Fake:
    name: str
    model: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def test_target_by_name_url_or_the_only_serve() -> None:
    a, b = Fake("a-8080", "tiny-llama", 8080), Fake("b-8081", "other", 8081)
    assert chat.target_url("b-8081", [a, b]) == chat.Target("http://127.0.0.1:8081", "other")
    assert chat.target_url(None, [a]) == chat.Target("http://127.0.0.1:8080", "tiny-llama")
    assert chat.target_url("http://127.0.0.1:9000/v1/", []) == chat.Target("http://127.0.0.1:9000", None)
    assert chat.target_url("http://[::1]:9000", []).base == "http://[::1]:9000"
    for bad in (None, "nope"):
        with pytest.raises(InvalidValue):
            chat.target_url(bad, [a, b])
    for bad in ("ftp://x", "http://:80", "http://h:99999", "http://h/v1?x=1"):
        with pytest.raises(InvalidValue):
            chat.target_url(bad, [])


def test_prompt_json_prints_the_final_message_only(server: Server) -> None:
    proc = run_provision("chat", server.url, "--prompt", "x y", "--json", "--max-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["message"] == {"role": "assistant", "content": "[1] y x"} and data["model"] == "tiny-test"
    assert "[1] y x" in proc.stderr  # the streamed tokens went to stderr
    proc = run_provision("chat", server.url, "--prompt", "x y")
    assert proc.returncode == 0 and proc.stdout == "[1] y x\n"
    proc = run_provision("chat", server.url, "--prompt", "boom")
    assert proc.returncode == 38 and "E028" in proc.stderr and "fix:" in proc.stderr


def test_repl_in_a_pty(server: Server) -> None:
    status, screen = pty_session(
        ["chat", server.url, "--max-tokens", "4"],
        ["first words", "second", "/clear", "third", "/exit"],
        ["you> ", "[1] words first", "[2] second", "(history cleared)", "[1] third", "you> "],
        timeout=60,
    )
    assert status == 0, screen
    assert [len(r["messages"]) for r in server.requests] == [1, 3, 1]


def test_chat_names_a_serve_that_is_not_running(tmp_path: Path) -> None:
    proc = run_provision("chat", "no-such-serve", env={"PROVISION_CACHE": str(tmp_path)})
    assert proc.returncode == 13 and "no serve named 'no-such-serve'" in proc.stderr


def test_interactive_json_keeps_stdout_for_the_final_message(server: Server) -> None:
    proc = run_provision("chat", server.url, "--json", stdin="a b\nc\n/exit\n")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]  # nothing but the JSON: prompts and tokens went to stderr
    assert data["message"]["content"] == "[2] c" and data["turns"] == 2
    assert "you> " in proc.stderr and "[1] b a" in proc.stderr
