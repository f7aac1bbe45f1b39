"""`provision chat [NAME|URL] [--prompt TEXT] [--json]`: chat with a served model (OpenAI-compatible)."""

from __future__ import annotations

import argparse
import sys

from provision.cli import output
from provision.cli.output import command, human_stream
from provision.core import values
from provision.core.result import Result

# The commands this module adds, with their one-line help (`provision --help` lists these
# without importing anything a command needs).
COMMANDS = {
    "chat": "chat with a served model (a `provision ps` name or any OpenAI-compatible URL), tokens streamed",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "chat", COMMANDS["chat"], "provision chat llama-linux-8080",
                "provision chat http://127.0.0.1:8080 --prompt 'Hello' --json", json=True)  # fmt: skip
    p.add_argument("target", nargs="?", metavar="NAME|URL", help="default: the only running serve")
    p.add_argument("--prompt", default=None, help="ask once, print the reply, exit")
    p.add_argument("--model", default=None, help="model name for the request (default: the served one)")
    p.add_argument("--system", default=None, help="a system message before the conversation")
    p.add_argument("--max-tokens", type=int, default=512, metavar="N", help="per reply (default 512)")
    p.add_argument("--temperature", type=float, default=None, help="default: the server's")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="seconds a reply may stall (default 300)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> Result:
    # With --json the tokens stream to stderr and stdout carries the final message's envelope alone.
    from provision.chat import client as chat
    from provision.chat import session as chat_session
    from provision.serve import state as serve_state

    values.seconds(args.timeout, "--timeout")
    if args.max_tokens < 1:
        from provision.core.errors import InvalidValue

        raise InvalidValue(f"--max-tokens {args.max_tokens}: must be at least 1", fix="--max-tokens 512")
    served = serve_state.entries()
    target = chat.target_url(args.target, served)
    # a serve of ours, by name, by its URL or the only one: its model's stop strings go with each request
    ours = next((e for e in served if e.url == target.base), None)
    client = chat.ChatClient(target, model=args.model, timeout=args.timeout, stop=ours.stop if ours else ())
    out = human_stream(args)
    session = chat_session.Session(client, out, system=args.system, max_tokens=args.max_tokens,
                                   temperature=args.temperature)  # fmt: skip
    if args.prompt is not None:
        session.ask(args.prompt)
        out.write("\n")
        out.flush()
    else:
        def read(prompt: str) -> str:
            # the prompt goes where the tokens go: with --json, stdout carries the final JSON alone
            return output.ask(prompt, on_stdout=out is sys.stdout)

        chat_session.repl(session, read, output.note)
    data = {"url": target.base, "model": client.model, "message": session.last_reply(),
            "turns": sum(1 for m in session.history if m["role"] == "assistant")}  # fmt: skip
    return Result(data, None)
