"""llama-server's options through `provision serve` (--ctx-size, --temp, --ngl, --threads, --embeddings,
--runtime-args), and a used port named by E027.

The guest command is run by a real ``sh`` with a stand-in llama-server that writes down its argv: each
value must arrive as one argument, whatever shell characters it holds. Nothing here boots a guest.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from provision.core import catalog
from provision.core.errors import InvalidValue, PortInUse
from provision.serve import engine as serving
from provision.serve import state as serve_state

STACK = catalog.load().get("llama-linux")


def nasty(marker: Path) -> str:
    """A value a shell would split, expand and run: the marker file appears if one ever does."""
    return f"a b;$(touch {marker})'\"`touch {marker}`*"


def run_guest_command(command: list[str], tmp_path: Path) -> list[str]:
    """``command`` as the guest's job runs it, with a llama-server that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "llama-server"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MODEL": "/models/my model.gguf"}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True)
    return list(json.loads(proc.stdout))


def test_each_option_reaches_llama_server_as_one_argument_never_parsed_by_a_shell(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    value = nasty(marker)
    extra = serving.split_runtime_args(f"--top-k 7 --alias-x {shlex.quote(value)}")
    opts = serving.ServerOptions(temp=0.25, ngl=12, threads=3, embeddings=True, runtime_args=extra)
    argv = run_guest_command(serving.server_command(STACK, True, "tiny", 2048, 2, opts), tmp_path)
    assert argv[:2] == ["-m", "/models/my model.gguf"]
    assert argv[argv.index("--n-gpu-layers") + 1] == "12" and argv[argv.index("--device") + 1] == "Vulkan0"
    assert argv[argv.index("--ctx-size") + 1] == "2048" and argv[argv.index("--temp") + 1] == "0.25"
    assert argv[argv.index("--threads") + 1] == "3" and "--embeddings" in argv
    assert argv[-4:] == ["--top-k", "7", "--alias-x", value]
    assert not marker.exists()


def test_the_model_s_chat_template_is_one_argument_too(tmp_path: Path) -> None:
    template = "{%- for m in messages %}{{ m['content'] }}\n$HOME `id` {% endfor %}"
    opts = serving.ServerOptions(chat_template=template, model_args=("--temp", "0.2"), temp=0.7)
    argv = run_guest_command(serving.server_command(STACK, False, "tiny", None, 1, opts), tmp_path)
    assert argv[argv.index("--chat-template") + 1] == template and "--jinja" in argv
    # the user's --temp comes after the model's default: llama-server keeps the last one
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--temp"] == ["0.2", "0.7"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("--port 9000", "--port is set by provision serve"),
        ("--model=/x.gguf", "--model is set by provision serve"),
        ("-ngl 5", "use provision serve --ngl"),
        ("--embeddings", "use provision serve --embeddings"),
        ("--top-k 'unclosed", "No closing quotation"),
        ("--x 'a\nb'", "control character"),
    ],
)
def test_runtime_args_that_serve_owns_or_cannot_pass_are_e003(text: str, words: str) -> None:
    with pytest.raises(InvalidValue) as exc:
        serving.split_runtime_args(text)
    assert words in f"{exc.value} fix: {exc.value.fix}"


@pytest.mark.parametrize(
    ("opts", "gpu", "words"),
    [
        (serving.ServerOptions(ngl=10), False, "only with --gpu"),
        (serving.ServerOptions(ngl=0), True, "expected 1-999"),
        (serving.ServerOptions(temp=-1.0), False, "--temp"),
        (serving.ServerOptions(temp=float("nan")), False, "--temp"),
        (serving.ServerOptions(threads=0), False, "--threads"),
    ],
)
def test_bad_option_values_are_e003(opts: serving.ServerOptions, gpu: bool, words: str) -> None:
    with pytest.raises(InvalidValue, match=words):
        serving.check_options(opts, gpu)


def provision(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_serve_takes_llama_server_flags_and_checks_them_before_anything_runs(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    base = ("serve", "llama-linux", "--model", str(model), "--port", "18931")
    for flags, words in ((("--temp", "9"), "--temp 9.0: expected 0-5"), (("--ngl", "4"), "only with --gpu"),
                         (("--runtime-args", "--port 1 --x"), "--port is set by provision serve")):  # fmt: skip
        proc = provision(*base, *flags)
        assert proc.returncode == 13 and "E003" in proc.stderr and words in proc.stderr, proc.stderr
        assert "fix:" in proc.stderr and "Traceback" not in proc.stderr and "qemu" not in proc.stderr
    helped = provision("serve", "--help").stdout
    for flag in ("--ctx-size", "--temp", "--ngl", "--threads", "--embeddings", "--runtime-args"):
        assert flag in helped


def test_the_detach_supervisor_gets_the_same_options() -> None:
    opts = serving.ServerOptions(temp=0.5, ngl=3, threads=2, embeddings=True,
                                 runtime_args=("--top-k", "7", "--x", "a b"))  # fmt: skip
    extra = serving.split_runtime_args(opts.serve_argv()[-1].split("=", 1)[1])
    again = serving.ServerOptions(temp=0.5, ngl=3, threads=2, embeddings=True, runtime_args=extra)
    assert again == opts
    from provision.cli import build_parser

    args = build_parser().parse_args(["serve", "llama-linux", "--model", "m", "--gpu", *opts.serve_argv()])
    assert (args.temp, args.ngl, args.threads, args.embeddings) == (0.5, 3, 2, True)
    assert serving.split_runtime_args(args.runtime_args) == opts.runtime_args


# --- a used port -----------------------------------------------------------------------------------


@pytest.fixture
def held_by_a_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, Path]:
    """A live serve entry on a port nothing listens on yet (its guest still boots), owned by this process."""
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    port = 18000 + os.getpid() % 1000
    entry = serve_state.own_entry(name="first", stack="llama-linux", model="m", gpu=False, host="127.0.0.1", port=port)
    serve_state.claim(entry)
    return port, tmp_path / "cache"


def test_a_port_held_by_a_booting_serve_is_e027_naming_the_port(held_by_a_serve: tuple[int, Path]) -> None:
    port, _ = held_by_a_serve
    serving.check_port_free("127.0.0.1", port + 1)  # nothing holds the next one
    with pytest.raises(PortInUse, match=f"port {port} is taken: the serve 'first'") as exc:
        serving.check_port_free("127.0.0.1", port)
    assert exc.value.fix is not None and "provision stop first" in exc.value.fix


def test_a_second_serve_on_the_port_says_which_port_not_pick_another_name(held_by_a_serve: tuple[int, Path],
                                                                          tmp_path: Path) -> None:  # fmt: skip
    port, cache = held_by_a_serve
    # the default name of a serve on that port is taken too: the port is what to change, and E027 says so
    serve_state.claim(serve_state.own_entry(name=f"llama-linux-{port}", stack="llama-linux", model="m", gpu=False,
                                            host="127.0.0.1", port=port))  # fmt: skip
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    for detach in ([], ["--detach"]):
        proc = provision("serve", "llama-linux", "--model", str(model), "--port", str(port), *detach,
                         env={"PROVISION_CACHE": str(cache)})  # fmt: skip
        assert proc.returncode == 37 and f"E027: port {port} is taken" in proc.stderr, proc.stderr
        assert "--name" not in proc.stderr and f"--port {port + 1}" in proc.stderr
