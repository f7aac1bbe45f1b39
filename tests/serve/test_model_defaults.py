"""An ollama model's template and params become llama-server's chat template and defaults.

The conversion is checked by rendering the Jinja it makes (jinja2, with and without the block
whitespace rules llama-server's engine applies) against what ollama's Go template gives, and then by
a real llama-server (Debian's, from the host-tools chroot): a model pulled from an ollama-style
registry on 127.0.0.1 is served with the very command `provision serve` gives its guest, and
/props and /apply-template are read back. A GGUF without ollama layers keeps its own template, and
--embeddings serves /v1/embeddings.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest

from provision import cli
from provision.cli import build_parser
from provision.cli import serve as serve_cli
from provision.core import catalog
from provision.hosts.linux.tools import host_tools
from provision.serve import engine, model_defaults
from tests.models import models_http, registries

LEGACY = registries.TEMPLATE  # "{{ .System }} USER: {{ .Prompt }} ASSISTANT:"
CHATML = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""
PHI = """{{ if .System }}<|system|>
{{ .System }}<|end|>
{{ end }}{{ if .Prompt }}<|user|>
{{ .Prompt }}<|end|>
{{ end }}<|assistant|>
{{ .Response }}<|end|>
"""
SYSTEM_HI = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
THREE = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]


def render(template: str, messages: list[dict[str, str]], trim: bool = False) -> str:
    env = jinja2.Environment(trim_blocks=trim, lstrip_blocks=trim)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True)


@pytest.mark.parametrize(
    ("go", "messages", "ollama"),
    [
        (LEGACY, SYSTEM_HI, "S USER: hi ASSISTANT:"),
        (LEGACY, THREE, " USER: a ASSISTANT:b USER: c ASSISTANT:"),  # no .Response: ollama appends it
        (PHI, SYSTEM_HI, "<|system|>\nS<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"),
        (PHI, THREE, "<|user|>\na<|end|>\n<|assistant|>\nb<|end|>\n<|user|>\nc<|end|>\n<|assistant|>\n"),
        (CHATML, SYSTEM_HI, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
        ('{{ range .Messages }}{{ if eq .Role "user" }}[U]{{ .Content }}{{ else if (and $.System (ne .Role "x")) }}'
         "[{{ .Role }}]{{ end }}{{ end }}", SYSTEM_HI, "[system][U]hi"),
        ("{{- if .System }}  {{ .System -}}  \n{{ end -}} \n {{ .Prompt }}", SYSTEM_HI, "  Shi"),
    ],
)
def test_the_jinja_renders_what_the_go_template_renders(go: str, messages: list[dict[str, str]], ollama: str) -> None:
    jinja = model_defaults.to_jinja(go)
    assert render(jinja, messages) == ollama
    # llama-server's engine trims and lstrips blocks: the text must not depend on it
    assert render(jinja, messages, trim=True) == ollama


@pytest.mark.parametrize("go", ["{{ .Tools }}", "{{ $x := 1 }}{{ $x }}", "{{ with .System }}x{{ end }}",
                                "{{ if .System }}", "{{ range .Messages }}{{ .Prompt }}{{ end }}",
                                "{{ if .System }}{{ .Response }}{{ end }}", "{% raw %}{{ .Prompt }}"])  # fmt: skip
def test_a_template_it_cannot_convert_leaves_the_gguf_s_own_and_says_why(go: str) -> None:
    found = model_defaults.from_layers(go, None)
    assert found.chat_template is None and "the GGUF's own" in found.notes[0]


def test_params_become_llama_server_defaults_and_stop_is_kept_for_each_request() -> None:
    found = model_defaults.from_layers(None, {"temperature": 0.2, "top_k": 40, "num_ctx": 2048, "stop": ["USER:"],
                                              "seed": 1.5, "penalize_newline": True, "top_p": "x"})  # fmt: skip
    assert found.args == ("--temp", "0.2", "--top-k", "40") and found.ctx == 2048 and found.chat_template is None
    notes = "\n".join(found.notes)
    assert found.stop == ("USER:",) and 'stop ["USER:"]: sent with each request by provision chat' in notes
    assert model_defaults.from_layers(None, {"stop": "</s>"}).stop == ("</s>",)  # ollama allows one string
    bad = model_defaults.from_layers(None, {"stop": [1, ""]})
    assert bad.stop == () and "param stop=[1, \"\"]: not applied" in bad.notes[0]
    for ignored in ("seed=1.5", "penalize_newline=true", 'top_p="x"'):
        assert f"param {ignored}: not applied" in notes


# --- a real llama-server ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read().decode()
        assert resp.status == 200, f"{path}: {resp.status} {data[:300]}"
        return dict(json.loads(data))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def llama_server() -> host_tools.HostTools:
    tools = host_tools.locate()
    assert tools is not None and tools.is_chroot, "the host-tools chroot (llama.cpp-tools inside) is needed: " \
                                                  "provision host-tools"  # fmt: skip
    assert host_tools.find(tools, "usr/bin/llama-server"), f"no llama-server in {tools.root}"
    return tools


@contextlib.contextmanager
def serving(tools: host_tools.HostTools, req: engine.ServeRequest, log: Path) -> Iterator[int]:
    """The guest's command for ``req`` (engine.server_command) run by the chroot's llama-server, its
    address moved to a free loopback port; yields the port once /health answers."""
    command = req.command()
    port = free_port()
    at = command.index("--port")
    command[at + 1] = str(port)
    command[command.index("--host") + 1] = "127.0.0.1"
    model = req.model_path.resolve()
    chroot = tools.chroot().with_binds({model.parent: "/mnt/model"})
    argv = chroot.argv(command, env={"PATH": "/usr/bin:/bin", "MODEL": f"/mnt/model/{model.name}"})
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not engine.health("127.0.0.1", port):
            assert proc.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, "llama-server did not answer /health"
            time.sleep(0.3)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def request(*flags: str) -> engine.ServeRequest:
    """The request `provision serve` builds for these flags (model defaults included), without a guest."""
    args = build_parser().parse_args(["serve", "llama-linux", *flags])
    stack = catalog.load().get("llama-linux")
    opts = engine.check_options(engine.ServerOptions(temp=args.temp, embeddings=args.embeddings,
                                                     runtime_args=engine.split_runtime_args(args.runtime_args)),
                                args.gpu)  # fmt: skip
    return serve_cli.serve_request(args, stack, "127.0.0.1", "t", opts)


@pytest.fixture
def pulled(empty_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """tiny-llama pulled as `ollama://tiny` from an ollama-style registry on 127.0.0.1 (template, params)."""
    from provision.models import store as models

    tiny = models.Store(root=tmp_path / "synth", out=sys.stderr).synth(models.SMOKE_MODEL).path.read_bytes()
    server = models_http.start({})
    try:
        registries.publish_ollama(server, tiny)
        monkeypatch.setenv("PROVISION_OLLAMA_REGISTRY", server.base.removeprefix("http://"))
        monkeypatch.setenv("PROVISION_SHORTNAMES", str(tmp_path / "no-shortnames.conf"))
        assert cli.main(["model", "pull", "ollama://tiny"]) == 0
        yield "tiny-latest"
    finally:
        models_http.stop(server)


@pytest.mark.slow
@pytest.mark.root
def test_served_ollama_model_reports_its_template_and_temperature_in_props(
    llama_server: host_tools.HostTools, pulled: str, tmp_path: Path
) -> None:
    req = request("--model", pulled)
    with serving(llama_server, req, tmp_path / "server.log") as port:
        props = call(port, "GET", "/props")
        assert props["chat_template"] == model_defaults.to_jinja(LEGACY)
        assert props["default_generation_settings"]["params"]["temperature"] == pytest.approx(0.2)
        assert props["model_alias"] == pulled
        prompt = call(port, "POST", "/apply-template", {"messages": SYSTEM_HI})["prompt"]
        assert prompt == "S USER: hi ASSISTANT:"
        assert call(port, "POST", "/apply-template", {"messages": THREE})["prompt"] == \
            " USER: a ASSISTANT:b USER: c ASSISTANT:"  # fmt: skip
    # the user's --temp wins over the model's
    with serving(llama_server, request("--model", pulled, "--temp", "0.7"), tmp_path / "server2.log") as port:
        assert call(port, "GET", "/props")["default_generation_settings"]["params"]["temperature"] == \
            pytest.approx(0.7)  # fmt: skip


@pytest.mark.slow
@pytest.mark.root
def test_a_gguf_keeps_its_own_template_and_embeddings_serve_v1_embeddings(
    llama_server: host_tools.HostTools, pulled: str, tmp_path: Path
) -> None:
    from provision.models import store as models

    own = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}<<assistant>>"
    blob = models.Store(out=sys.stderr).path(pulled)
    gguf = tmp_path / "gguf" / "own-template.gguf"
    gguf.parent.mkdir()
    tool = Path(sys.executable).with_name("gguf-new-metadata")
    subprocess.run([str(tool), "--chat-template", own, str(blob), str(gguf)], input="y\n", capture_output=True,
                   text=True, timeout=120, check=True)  # fmt: skip
    req = request("--model", str(gguf), "--embeddings", "--runtime-args", "--pooling mean")
    assert req.options.chat_template is None and req.options.model_args == ()
    with serving(llama_server, req, tmp_path / "server.log") as port:
        assert call(port, "GET", "/props")["chat_template"] == own
        data = call(port, "POST", "/v1/embeddings", {"input": "hello", "model": req.model})["data"]
        vector = data[0]["embedding"]
        assert len(vector) == 128 and all(isinstance(x, float) for x in vector) and any(vector)


def test_chat_sends_the_stop_strings_of_the_serve_it_talks_to(pulled: str, capsys: pytest.CaptureFixture[str]) -> None:
    """serve records the model's stop strings in its ps entry (served under its alias, `tiny` here, not its
    store name); chat sends them to that serve, by name or by URL, and to no other server."""
    from provision.cli.run import resolve_model
    from provision.cli.serve_model import apply_defaults, model_defaults
    from provision.serve import state as serve_state
    from tests.chat.sse_server import Server

    options = apply_defaults(engine.ServerOptions(), model_defaults("ollama://tiny", resolve_model("ollama://tiny")))
    assert options.model_stop == tuple(registries.PARAMS["stop"])
    with Server() as ours, Server() as other:
        entry = serve_state.claim(serve_state.own_entry(
            name="tiny-8080", stack="llama-linux", model="tiny", gpu=False, host="127.0.0.1", port=ours.port,
            stop=list(options.model_stop)))  # fmt: skip
        try:
            for target in ("tiny-8080", ours.url, f"{ours.url}/v1"):
                assert cli.main(["chat", target, "--prompt", "a b", "--max-tokens", "4"]) == 0
            assert cli.main(["chat", other.url, "--prompt", "a b", "--max-tokens", "4"]) == 0
        finally:
            serve_state.release(entry)
        capsys.readouterr()
        assert [r.get("stop") for r in ours.requests] == [registries.PARAMS["stop"]] * 3
        assert "stop" not in other.requests[0]


def test_model_defaults_read_the_store_and_make_nothing_not_even_the_cache(empty_cache: Path) -> None:
    # serve --dry-run asks for them too: an unknown model has none, and no folder appears on the way
    from provision.cli.serve_model import model_defaults

    found = model_defaults("ollama://nothing-here", Path("/nonexistent.gguf"))
    assert found.chat_template is None and found.args == () and not empty_cache.exists()
