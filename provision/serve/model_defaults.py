"""An ollama model's template and parameters as llama-server's chat template and defaults.

An ollama pull keeps the model's Go template and its params beside the GGUF (models/records.py
``extras``). ollama renders the template itself; llama-server renders a Jinja chat template, so
the Go template is converted to one, as RamaLama does, where its actions are the common ones:
``.System``, ``.Prompt``, ``.Response``, ``range .Messages`` with ``.Role`` and ``.Content``,
``if``/``else if``/``else``, ``eq``/``ne``/``and``/``or``/``not``, comments and ``{{-``/``-}}``.
Anything else (``.Tools``, variables, ``slice``, ``with``…) is not guessed at: the GGUF's own
template is used then, and serve says so. A model without an ollama template keeps its GGUF's.

A legacy template (no ``.Messages``) is what ollama renders once per turn: the system text in
the first turn, each user message as ``.Prompt`` and the assistant's answer as ``.Response``; the
last turn ends where ``.Response`` stands (ollama appends ``{{ .Response }}`` when it is missing).

Literal text becomes a quoted Jinja string, so llama-server's block-whitespace rules (trim and
lstrip blocks) cannot eat a newline the Go template keeps.

Params become llama-server options; ``stop`` has no server-wide option in llama-server (each
request sends its own), so it is kept apart: `provision chat` sends it with every request to a
serve of ours. Pure: no I/O beyond reading the store.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# ollama's parameter -> llama-server's option, for the ones llama-server has as a server default.
PARAMS = {
    "temperature": "--temp",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "min_p": "--min-p",
    "typical_p": "--typical",
    "repeat_penalty": "--repeat-penalty",
    "repeat_last_n": "--repeat-last-n",
    "presence_penalty": "--presence-penalty",
    "frequency_penalty": "--frequency-penalty",
    "seed": "--seed",
    "num_predict": "--n-predict",
    "mirostat": "--mirostat",
    "mirostat_tau": "--mirostat-ent",
    "mirostat_eta": "--mirostat-lr",
}
INTEGER = {"top_k", "repeat_last_n", "seed", "num_predict", "mirostat", "num_ctx"}


@dataclass(frozen=True)
class ModelDefaults:
    chat_template: str | None = None  # Jinja; None: the GGUF's own
    args: tuple[str, ...] = ()  # llama-server options from the params
    ctx: int | None = None  # num_ctx, a default for --ctx-size
    stop: tuple[str, ...] = ()  # stop strings: a request's field, not a server option (chat sends them)
    notes: tuple[str, ...] = ()  # one line each: what was applied, what was not and why


class Unsupported(ValueError):
    """A Go template construct this converter does not translate."""


# --- Go template -> Jinja ----------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|[^\s()"]+)')
_FUNCS = {"eq": "==", "ne": "!=", "and": "and", "or": "or", "not": "not"}
_GO_SPACE = " \t\r\n"


def _string(text: str) -> str:
    """A Jinja string literal of ``text`` (JSON's escapes are Jinja's too)."""
    return json.dumps(text, ensure_ascii=False)


def _field(word: str, in_range: bool, legacy: bool) -> str:
    top = {".System": "system_message", "$.System": "system_message", ".Messages": "messages",
           "$.Messages": "messages"}  # fmt: skip
    if word in top:
        return top[word]
    if in_range and word in (".Role", ".Content"):
        return f"message[{_string(word[1:].lower())}]"
    if legacy and not in_range and word in (".Prompt", ".Response"):
        return word[1:].lower()
    raise Unsupported(f"{word!r}")


def _expr(tokens: list[str], in_range: bool, legacy: bool) -> str:
    pos = 0

    def operand() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise Unsupported("an incomplete expression")
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            inner = pipeline()
            if pos >= len(tokens) or tokens[pos] != ")":
                raise Unsupported("unbalanced parentheses")
            pos += 1
            return inner
        if tok.startswith('"'):
            try:
                return _string(json.loads(tok))
            except ValueError:
                raise Unsupported(f"the string {tok}") from None
        return _field(tok, in_range, legacy)

    def pipeline() -> str:
        nonlocal pos
        if pos < len(tokens) and tokens[pos] in _FUNCS:
            func = tokens[pos]
            pos += 1
            args = [operand()]
            while pos < len(tokens) and tokens[pos] != ")":
                args.append(operand())
            if func == "not":
                if len(args) != 1:
                    raise Unsupported("not with more than one argument")
                return f"(not {args[0]})"
            if func in ("eq", "ne") and len(args) != 2:
                raise Unsupported(f"{func} with {len(args)} arguments")
            return "(" + f" {_FUNCS[func]} ".join(args) + ")"
        return operand()

    out = pipeline()
    if pos != len(tokens):
        raise Unsupported(f"{' '.join(tokens)!r}")
    return out


def _tokens(text: str) -> list[str]:
    found, pos, text = [], 0, text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Unsupported(f"{text!r}")
        found.append(m.group(1))
        pos = m.end()
    return found


_RANGE = re.compile(r"^range\s+(?:\$\w*\s*(?:,\s*\$\w*\s*)?:=\s*)?\$?\.Messages$")


def _convert(go: str, legacy: bool) -> list[tuple[str, str]]:
    """The template as (kind, jinja) pieces, kind "text", "expr", "block" or "response"."""
    pieces: list[tuple[str, str]] = []
    stack: list[str] = []
    pos = 0
    trim_next = False
    for m in _ACTION.finditer(go):
        text = go[pos : m.start()]
        if trim_next:
            text = text.lstrip(_GO_SPACE)
        if m.group(1):
            text = text.rstrip(_GO_SPACE)
        if text:
            pieces.append(("text", "{{ " + _string(text) + " }}"))
        pos, trim_next = m.end(), bool(m.group(3))
        body = m.group(2).strip()
        in_range = "for" in stack
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise Unsupported("an unclosed comment")
            continue
        if _RANGE.match(body):
            if in_range:
                raise Unsupported("a range inside a range")
            stack.append("for")
            pieces.append(("block", "{% for message in messages %}"))
        elif body.startswith("if "):
            stack.append("if")
            pieces.append(("block", "{% if " + _expr(_tokens(body[3:]), in_range, legacy) + " %}"))
        elif body.startswith("else if "):
            if not stack or stack[-1] != "if":
                raise Unsupported("else if outside an if")
            pieces.append(("block", "{% elif " + _expr(_tokens(body[8:]), in_range, legacy) + " %}"))
        elif body == "else":
            if not stack or stack[-1] != "if":
                raise Unsupported("else outside an if")
            pieces.append(("block", "{% else %}"))
        elif body == "end":
            if not stack:
                raise Unsupported("an end without its block")
            pieces.append(("block", "{% end" + stack.pop() + " %}"))
        elif re.fullmatch(r"\w+.*", body) and body.split()[0] in ("with", "template", "define", "block", "range"):
            raise Unsupported(f"{{{{ {body} }}}}")
        else:
            expr = _expr(_tokens(body), in_range, legacy)
            kind = "response" if expr == "response" and not stack else "expr"
            pieces.append((kind, "{{ " + expr + " }}"))
    if stack:
        raise Unsupported(f"an unclosed {stack[-1]}")
    text = go[pos:]
    if trim_next:
        text = text.lstrip(_GO_SPACE)
    if text:
        pieces.append(("text", "{{ " + _string(text) + " }}"))
    return pieces


_SYSTEM = (
    "{%- set ns = namespace(system='', first=true) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endif -%}"
    "{%- endfor -%}"
)


def to_jinja(go: str) -> str:
    """The Jinja chat template for ollama's Go template ``go``; Unsupported when it cannot be."""
    if "{%" in go or "{#" in go:
        raise Unsupported("Jinja delimiters in the template's text")
    if ".Messages" in go:
        body = "".join(j for _, j in _convert(go, legacy=False))
        return _SYSTEM + "{%- set system_message = ns.system -%}" + body
    pieces = _convert(go, legacy=True)
    at = [i for i, (kind, _) in enumerate(pieces) if kind == "response"]
    if len(at) > 1:
        raise Unsupported(".Response more than once")
    if any(kind == "expr" and j == "{{ response }}" for kind, j in pieces):
        raise Unsupported(".Response inside a block")
    cut = at[0] if at else len(pieces)
    before = "".join(j for _, j in pieces[:cut])
    after = "".join(j for _, j in pieces[cut + 1 :])
    nxt = "messages[loop.index0 + 1]"
    return (
        _SYSTEM + "{%- for message in messages -%}{%- if message['role'] == 'user' -%}"
        "{%- set system_message = ns.system if ns.first else '' -%}{%- set ns.first = false -%}"
        "{%- set prompt = message['content'] -%}"
        f"{{%- if loop.index0 + 1 < messages|length and {nxt}['role'] == 'assistant' -%}}"
        f"{{%- set response = {nxt}['content'] -%}}{before}{{{{ response }}}}{after}"
        f"{{%- else -%}}{before}{{%- endif -%}}"
        "{%- endif -%}{%- endfor -%}"
    )


# --- params ------------------------------------------------------------------------------------


def _number(key: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if key in INTEGER:
        return str(int(value)) if float(value).is_integer() else None
    return repr(float(value))


def from_layers(template: str | None, params: Mapping[str, Any] | None) -> ModelDefaults:
    """What serve passes llama-server for an ollama model's template and params (both optional)."""
    notes: list[str] = []
    chat_template = None
    if template is not None and template.strip():
        try:
            chat_template = to_jinja(template)
            notes.append("chat template: the model's ollama template, as Jinja")
        except Unsupported as exc:
            notes.append(f"chat template: the GGUF's own (the ollama template uses {exc}, which is not converted)")
    args: list[str] = []
    ctx = None
    stop: tuple[str, ...] = ()
    for key, value in sorted((params or {}).items()):
        if key == "stop":
            words = [value] if isinstance(value, str) else value
            if isinstance(words, list) and words and all(isinstance(w, str) and w for w in words):
                stop = tuple(words)
                notes.append(f"stop {json.dumps(list(stop))}: sent with each request by provision chat (llama-server "
                             "has no server default for it; other clients send their own)")  # fmt: skip
            else:
                notes.append(f"param stop={json.dumps(value)}: not applied (not a list of strings)")
            continue
        text = _number(key, value)
        if key == "num_ctx" and text is not None and 0 < int(text) <= 1 << 20:
            ctx = int(text)
        elif key in PARAMS and text is not None:
            args += [PARAMS[key], text]
        else:
            notes.append(f"param {key}={json.dumps(value)}: not applied (no llama-server option takes it)")
    if args or ctx is not None:
        notes.append("defaults: " + " ".join(args + (["--ctx-size", str(ctx)] if ctx is not None else [])))
    return ModelDefaults(chat_template, tuple(args), ctx, stop=stop, notes=tuple(notes))


def for_stored(store: Any, name: str) -> ModelDefaults:
    """The defaults of the stored model ``name`` (none for a model without ollama layers)."""
    ref = store.ref(name)
    extras = (ref.extras or {}) if ref is not None else {}
    template = params = None
    if "template" in extras:
        template = store.blob_path(extras["template"]["sha256"]).read_bytes().decode("utf-8", "replace")
    if "params" in extras:
        try:
            loaded = json.loads(store.blob_path(extras["params"]["sha256"]).read_bytes())
        except ValueError:
            loaded = None
        params = loaded if isinstance(loaded, dict) else None
    return from_layers(template, params)


def for_model(store: Any, name: str, path: Any) -> ModelDefaults:
    """The defaults of the stored model served from ``path``: the ref named ``name``, else one whose
    file it is (a name resolved to another spelling), preferring one with ollama layers."""
    target = path.resolve()
    refs = [r for r in store.refs() if store.blob_path(r.sha256).resolve() == target]
    refs.sort(key=lambda r: (r.name != name, not r.extras))
    return for_stored(store, refs[0].name) if refs else ModelDefaults()
