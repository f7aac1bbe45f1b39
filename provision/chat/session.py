"""The chat loop: history, ``/clear``, ``/exit``, tokens written as they stream in.

Input and output are passed in (a line reader and a text stream), so the loop runs the same in
a terminal, a pty and a test; only ``cli/chat.py`` touches the real stdin/stdout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TextIO

from provision.chat.client import Message
from provision.chat.screen import Screen

PROMPT = "you> "
HELP = "/clear forgets the conversation, /exit (or Ctrl-D) ends it"


class Streamer(Protocol):
    def stream(self, messages: list[Message], *, max_tokens: int | None, temperature: float | None) -> object: ...


@dataclass
class Session:
    client: Streamer
    out: TextIO
    system: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    history: list[Message] = field(default_factory=list)

    def messages(self) -> list[Message]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def ask(self, text: str) -> str:
        """One turn: the reply streamed to ``out`` piece by piece, then kept in the history."""
        self.history.append({"role": "user", "content": text})
        pieces: list[str] = []
        screen = Screen()  # the terminal gets text; the history keeps what the model sent
        try:
            stream = self.client.stream(self.messages(), max_tokens=self.max_tokens, temperature=self.temperature)
            for piece in stream:  # type: ignore[attr-defined]
                pieces.append(piece)
                self.out.write(screen.feed(piece))
                self.out.flush()
        except BaseException:
            self.history.pop()  # a turn that got no whole answer is not part of the conversation
            raise
        finally:
            self.out.write(screen.flush())
        reply = "".join(pieces)
        self.history.append({"role": "assistant", "content": reply})
        return reply

    def last_reply(self) -> Message | None:
        return next((m for m in reversed(self.history) if m["role"] == "assistant"), None)


def repl(session: Session, read: Callable[[str], str], note: Callable[[str], None]) -> int:
    """Read lines until /exit or end of input; returns the number of turns answered."""
    turns = 0
    note(f"provision chat: {HELP}")
    while True:
        try:
            line = read(PROMPT).strip()
        except EOFError:
            session.out.write("\n")
            return turns
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return turns
        if line == "/clear":
            session.history.clear()
            note("(history cleared)")
            continue
        if line.startswith("/"):
            note(f"unknown command {line.split()[0]}: {HELP}")
            continue
        session.ask(line)
        session.out.write("\n")
        session.out.flush()
        turns += 1
