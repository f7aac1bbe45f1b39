"""`provision chat` through a pty against a real `provision serve llama-linux --model tiny-llama
--gpu` guest (QEMU TCG + Venus on lavapipe): a served name from `provision ps`, streamed replies,
history, /clear, /exit; then `--prompt --json` by URL, whose text equals llama-server's own
non-streamed greedy answer to the same messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chat.pty_driver import pty_session
from tests.serve.test_serve_e2e import free_port, post, provision
from tests.serve.test_serve_e2e import model as model  # noqa: F401 - the module fixture, reused

pytestmark = pytest.mark.slow
NAME = "e2e-chat"
WAIT_S = 1500  # boot + model load under TCG while other guests share the 2 cores


@pytest.fixture(scope="module")
def served(model: Path) -> Iterator[dict[str, Any]]:  # noqa: F811
    port = free_port()
    proc = provision(
        "serve", "llama-linux", "--model", "tiny-llama", "--gpu", "--detach", "--port", str(port),
        "--name", NAME, "--wait", str(WAIT_S), "--json", timeout=WAIT_S + 120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield json.loads(proc.stdout)["data"]
    provision("stop", NAME, timeout=180)


def test_chat_in_a_pty_against_the_served_guest(served: dict[str, Any]) -> None:
    assert NAME in provision("ps").stdout
    status, screen = pty_session(
        ["chat", NAME, "--max-tokens", "6", "--temperature", "0", "--json"],
        ["t1 t2 t3", "t4", "/clear", "t5", "/exit"],
        ["you> ", "you> ", "you> ", "(history cleared)", "you> ", "you> "],
        timeout=900,
    )
    assert status == 0, screen
    # --json: the final message comes last on the terminal; /clear left one turn in the history
    data = json.loads(screen[screen.rindex('{\r\n  "command"') :].replace("\r\n", "\n"))["data"]
    assert data["turns"] == 1 and data["model"] == "tiny-llama", data
    # the streamed pieces add up to llama-server's own greedy answer to the cleared history
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "t5"}], "max_tokens": 6, "temperature": 0}
    direct = post(served["port"], "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    assert data["message"] == {"role": "assistant", "content": direct} and direct
    assert screen.count("you> ") >= 5  # a prompt for every line typed


def test_prompt_json_by_url_equals_the_servers_greedy_answer(served: dict[str, Any]) -> None:
    messages = [{"role": "user", "content": "t1 t2 t3"}]
    proc = provision("chat", served["url"], "--prompt", "t1 t2 t3", "--json", "--max-tokens", "8",
                     "--temperature", "0", timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)["data"]
    assert data["model"] == "tiny-llama" and data["message"]["role"] == "assistant"
    body = {"model": "tiny-llama", "messages": messages, "max_tokens": 8, "temperature": 0}
    direct = post(served["port"], "/v1/chat/completions", body)["choices"][0]["message"]["content"]
    assert data["message"]["content"] == direct and direct
