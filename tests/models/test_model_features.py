"""Split GGUFs, short names, the size shown (and asked) before a big pull, and `model inspect`."""

from __future__ import annotations

import hashlib
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors
from tests.models import models_http, registries

REPO = Path(__file__).resolve().parents[2]
SPLIT = [f"split-Q8_0-0000{k}-of-00003.gguf" for k in (1, 2, 3)]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A real split GGUF (gguf-py's writer, 2 tensors a shard): what llama.cpp's gguf-split makes."""
    import gguf
    import numpy as np

    folder = tmp_path_factory.mktemp("split")
    writer = gguf.GGUFWriter(str(folder / "split-Q8_0.gguf"), "llama", split_max_tensors=2)
    writer.add_name("split-test")
    writer.add_context_length(64)
    writer.add_file_type(7)  # MOSTLY_Q8_0
    for i in range(5):
        writer.add_tensor(f"t{i}", np.full((64,), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {name: (folder / name).read_bytes() for name in SPLIT}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    srv = models_http.start({})
    monkeypatch.setenv("HF_ENDPOINT", srv.base)
    monkeypatch.setenv("PROVISION_OLLAMA_REGISTRY", srv.base.removeprefix("http://"))
    yield srv
    models_http.stop(srv)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- split GGUFs ----------------------------------------------------------------------------------


def test_a_split_gguf_is_every_part_verified_and_one_model_pointed_at_part_1(cache, server, parts, capsys):
    paths = registries.publish_hf(server, "org/Split-GGUF", parts)
    server.path_plans[paths[SPLIT[1]]] = ["truncate_at:200"]  # part 2 closes midway, then resumes
    server.path_plans[paths[SPLIT[2]]] = ["truncate_at:100", "wrong_range"]
    assert cli.main(["model", "pull", "hf.co/org/Split-GGUF:Q8_0", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["data"]
    assert report["name"] == "split-Q8_0" and [p["file"] for p in report["parts"]] == SPLIT
    first = Path(report["path"])
    assert first.name == SPLIT[0] and first.read_bytes() == parts[SPLIT[0]]
    for name in SPLIT:  # llama.cpp finds part K by its name beside part 1
        assert (first.parent / name).read_bytes() == parts[name]
        assert (cache / "blobs" / f"sha256-{sha(parts[name])}").exists()
    assert [r.range for r in server.requests if r.path == paths[SPLIT[1]]] == [None, "bytes=200-"]
    assert cli.main(["model", "inspect", "split-Q8_0", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["data"]
    assert (info["parts"], info["tensor_count"], info["quantization"]) == (3, 5, "Q8_0")
    assert info["size"] == sum(len(b) for b in parts.values())
    assert cli.main(["model", "list", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out)["data"]["models"] if r["name"] == "split-Q8_0")
    assert row["stored"] and row["size"] == info["size"] and "file listing" in row["note"]
    assert cli.main(["model", "verify", "split-Q8_0"]) == 0
    assert cli.main(["model", "rm", "split-Q8_0"]) == 0
    assert not any((cache / "blobs").iterdir()) and not (cache / "split" / "split-Q8_0").exists()


def test_a_split_part_with_the_wrong_digest_leaves_no_model(cache, server, parts, capsys):
    bad = parts[SPLIT[2]][:-1] + b"\x01"
    registries.publish_hf(server, "org/Split-GGUF", parts, {SPLIT[2]: bad})
    assert cli.main(["model", "pull", "hf.co/org/Split-GGUF:Q8_0"]) == errors.ModelHashMismatch.exit_status
    assert "E011" in capsys.readouterr().err
    assert not any((cache / "refs").iterdir()) and not (cache / "split").exists()
    assert not (cache / "blobs" / f"sha256-{sha(parts[SPLIT[2]])}").exists()


def test_a_split_model_with_a_part_missing_from_the_listing_is_refused(cache, server, parts, capsys):
    registries.publish_hf(server, "org/Split-GGUF", {k: v for k, v in parts.items() if k != SPLIT[1]})
    assert cli.main(["model", "pull", "hf.co/org/Split-GGUF:Q8_0"]) == errors.UnknownModel.exit_status
    assert "incomplete" in capsys.readouterr().err
    assert [r.path.split("?")[0] for r in server.requests] == ["/api/models/org/Split-GGUF/tree/main"]


def test_a_killed_split_pull_resumes_the_part_it_was_in_and_keeps_the_finished_ones(cache, server, parts):
    paths = registries.publish_hf(server, "org/Split-GGUF", parts)
    server.path_plans[paths[SPLIT[1]]] = ["pause_at:200"]
    env = {**os.environ, "PROVISION_CACHE": str(cache.parent), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "provision", "model", "pull", "hf.co/org/Split-GGUF:Q8_0"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    partial = cache / "partial" / f"{sha(parts[SPLIT[1]])}.partial"
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= 200):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    server.release.set()
    assert not any((cache / "refs").iterdir())
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len([r for r in server.requests if r.path == paths[SPLIT[0]]]) == 1  # part 1 was kept
    assert [r.range for r in server.requests if r.path == paths[SPLIT[1]]] == [None, "bytes=200-"]


# --- short names ----------------------------------------------------------------------------------


def test_shortnames_ship_and_the_users_file_overrides_them(cache, server, tiny, capsys):
    assert cli.main(["model", "list", "--shortnames", "--json"]) == 0
    shipped = {r["name"]: r for r in json.loads(capsys.readouterr().out)["data"]["shortnames"]}
    assert shipped["tiny"]["reference"] == "tiny-llama"
    registries.publish_ollama(server, tiny, repo="library/mine", tag="v2")
    Path(os.environ["PROVISION_SHORTNAMES"]).write_text('[shortnames]\n"tiny" = "ollama://mine:v2"\n')
    assert cli.main(["model", "list", "--shortnames"]) == 0
    out = capsys.readouterr().out
    assert "ollama://mine:v2" in out and os.environ["PROVISION_SHORTNAMES"] in out
    assert cli.main(["model", "pull", "tiny", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["source"] == "ollama://library/mine:v2"


@pytest.mark.parametrize(
    "text,words",
    [
        ("[shortnames\n", "not a readable TOML"),
        ('[shortnames]\n"a" = "tiny"\n', "points at another short name"),
        ('[shortnames]\n"x" = "has space"\n', "is not NAME"),
        ('[aliases]\n"x" = "y"\n', "[aliases]"),
    ],
)
def test_a_bad_shortnames_file_is_e003_naming_the_file(cache, text, words, capsys):
    Path(os.environ["PROVISION_SHORTNAMES"]).write_text(text)
    assert cli.main(["model", "pull", "anything"]) == errors.InvalidValue.exit_status
    err = capsys.readouterr().err
    assert words in err and os.environ["PROVISION_SHORTNAMES"] in err and "fix:" in err


# --- the size before a big pull -------------------------------------------------------------------


def test_a_non_interactive_big_pull_prints_its_size_and_goes_on(cache, server, tiny, monkeypatch, capsys):
    registries.publish_ollama(server, tiny)
    monkeypatch.setenv("PROVISION_ASK_ABOVE", "100K")
    assert cli.main(["model", "pull", "ollama://tiny"]) == 0
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "tiny-latest: 911.6 KiB from ollama://library/tiny:latest"
    assert "not asking (non-interactive)" in err
    monkeypatch.setenv("PROVISION_ASK_ABOVE", "lots")
    assert cli.main(["model", "pull", "ollama://tiny"]) == errors.InvalidValue.exit_status


def _pty_pull(cache: Path, answer: bytes, *extra: str) -> tuple[int, str]:
    env = {**os.environ, "PROVISION_CACHE": str(cache.parent), "PYTHONPATH": str(REPO), "PROVISION_ASK_ABOVE": "1K"}
    controller, terminal = pty.openpty()
    cmd = [sys.executable, "-m", "provision", "model", "pull", "ollama://tiny", *extra]
    proc = subprocess.Popen(cmd, env=env, stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = b""
    deadline = time.monotonic() + 60
    answered = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # the child closed its side
                break
            if not chunk:
                break
            seen += chunk
        if not answered and b"[y/N]" in seen:
            os.write(controller, answer)
            answered = True
        if proc.poll() is not None and not ready:
            break
    os.close(controller)
    return proc.wait(timeout=30), seen.decode(errors="replace")


def test_an_interactive_big_pull_asks_and_no_fetches_nothing(cache, server, tiny):
    blob = registries.publish_ollama(server, tiny)
    status, text = _pty_pull(cache, b"n\n")
    assert status == errors.RunCancelled.exit_status and "pull 911.6 KiB? [y/N]" in text and "declined" in text
    assert not any(r.path == blob for r in server.requests)
    status, text = _pty_pull(cache, b"y\n")
    assert status == 0 and [r.path for r in server.requests if r.sent == len(tiny)] == [blob]


def test_yes_skips_the_question(cache, server, tiny):
    registries.publish_ollama(server, tiny)
    status, text = _pty_pull(cache, b"", "--yes")
    assert status == 0 and "[y/N]" not in text


# --- inspect --------------------------------------------------------------------------------------


def test_inspect_reads_the_gguf_metadata(cache, capsys):
    assert cli.main(["model", "synth", "tiny-llama"]) == 0
    capsys.readouterr()
    assert cli.main(["model", "inspect", "tiny-llama", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)["data"]
    assert (info["architecture"], info["context_length"], info["quantization"]) == ("llama", 256, "F16")
    assert info["tensor_count"] == 2 * 9 + 3 and info["size"] == 933504 and info["parts"] == 1
    embd, vocab, ff = 128, 512, 256
    per_layer = 2 * embd + 4 * embd * embd + 3 * ff * embd
    assert info["parameters"] == 2 * vocab * embd + embd + 2 * per_layer
    assert cli.main(["model", "inspect", "tiny-llama"]) == 0
    assert "architecture    llama" in capsys.readouterr().out
    assert cli.main(["model", "inspect", "no-such-model"]) == errors.UnknownModel.exit_status
