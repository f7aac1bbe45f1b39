"""One name resolves everywhere: what a pull took (NAME:TAG as typed, a short name, a reference or
URL pulled under any --name) names the model in `model path|inspect|verify|rm` and in `--model`
(run, serve, bench and perplexity resolve it through cli.run.resolve_model), and a fix line never
sends the user back to a pull that already succeeded. Pulls go to loopback servers speaking each
protocol (tests/models/registries.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from provision import cli
from provision.cli.run import resolve_model
from provision.core import errors, pins
from provision.models import names
from provision.models import store as models
from tests.models import models_http, registries


def host(server: models_http.ModelServer) -> str:
    return server.base.removeprefix("http://")


def model(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | None, str]:
    capsys.readouterr()
    status = cli.main(["model", *args, "--json"])
    captured = capsys.readouterr()
    return status, (json.loads(captured.out)["data"] if status == 0 else None), captured.err


def test_ollama_name_tag_works_as_typed_after_a_pull_by_url(cache, server, tiny, capsys):
    registries.publish_ollama(server, tiny, repo="library/kquant", tag="latest")
    assert cli.main(["model", "pull", f"ollama://{host(server)}/kquant:latest"]) == 0
    blob = cache / "blobs" / f"sha256-{hashlib.sha256(tiny).hexdigest()}"
    # every spelling of what was pulled names the stored kquant-latest
    spellings = ("kquant-latest", "kquant:latest", "kquant", f"ollama://{host(server)}/kquant:latest",
                 "ollama://kquant:latest", "ollama://library/kquant")  # fmt: skip
    for typed in spellings:
        status, data, err = model(capsys, "path", typed)
        assert status == 0, (typed, err)
        assert data == {"name": "kquant-latest", "path": str(blob)}
        assert resolve_model(typed) == blob  # --model of run, serve, bench and perplexity
        assert resolve_model(typed, fetch=False) == blob  # and their --dry-run, which writes nothing
    status, data, _ = model(capsys, "inspect", "kquant:latest")
    assert status == 0 and data["name"] == "kquant-latest" and data["extras"]["params"] == registries.PARAMS
    status, data, _ = model(capsys, "verify", "kquant:latest")
    assert status == 0 and data[0]["ok"]
    # another registry's kquant:latest is not this one
    status, _, err = model(capsys, "path", "ollama://elsewhere.example/kquant:latest")
    assert status == errors.UnknownModel.exit_status and "fix: provision model pull" in err
    status, data, _ = model(capsys, "rm", "kquant:latest")
    assert status == 0 and data["removed"]["name"] == "kquant-latest" and not blob.exists()


def test_a_shortname_that_pulled_is_the_name_afterwards_and_the_fix_never_loops(cache, server, tiny, capsys):
    registries.publish_ollama(server, tiny, repo="library/kquant", tag="latest")
    Path(os.environ["PROVISION_SHORTNAMES"]).write_text(
        f'[shortnames]\n"kq" = "ollama://{host(server)}/library/kquant:latest"\n'
    )
    status, _, err = model(capsys, "path", "kq")
    assert status == errors.UnknownModel.exit_status
    assert "never pulled" in err and "fix: provision model pull kq" in err  # not pulled yet: that fix is right
    assert cli.main(["model", "pull", "kq"]) == 0
    status, data, err = model(capsys, "path", "kq")  # the same fix now would be a loop; it resolves instead
    assert status == 0, err
    assert data["name"] == "kquant-latest"
    assert resolve_model("kq") == Path(data["path"])


def test_a_reference_pulled_under_another_name_is_found_by_its_source(cache, server, tiny, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    registries.publish_hf(server, "org/Tiny-GGUF", {"tiny-Q8_0.gguf": tiny})
    server.files["/files/plain.gguf"] = tiny
    url = f"{server.base}/files/plain.gguf"
    assert cli.main(["model", "pull", "hf.co/org/Tiny-GGUF:Q8_0", "--name", "mine"]) == 0
    assert cli.main(["model", "pull", url, "--name", "by-url", "--sha256", hashlib.sha256(tiny).hexdigest()]) == 0
    for typed, name in (("hf.co/org/Tiny-GGUF:Q8_0", "mine"), ("org/Tiny-GGUF:q8_0", "mine"), (url, "by-url")):
        status, data, err = model(capsys, "path", typed)
        assert status == 0, (typed, err)
        assert data["name"] == name


def test_shipped_shortnames_name_their_catalog_model(cache, capsys):
    # a dry run plans the catalog file a shipped short name stands for, making nothing (not even the store)
    pin = pins.default().models["qwen2.5-0.5b-instruct-q4_k_m"]
    assert resolve_model("qwen2.5:0.5b", fetch=False) == cache / "blobs" / f"sha256-{pin.sha256}"
    assert not cache.exists()
    store = models.Store(out=io.StringIO())
    found = names.lookup(store, "qwen2.5:0.5b")  # was E014 "pick another name with --name"
    assert (found.name, found.catalog) == (None, "qwen2.5-0.5b-instruct-q4_k_m")
    status, _, err = model(capsys, "path", "qwen2.5:0.5b")
    assert status == errors.UnknownModel.exit_status and "fix: provision model pull qwen2.5:0.5b" in err
    path = resolve_model("tiny")  # the shipped `tiny` -> tiny-llama, synthesized on first use like the name
    assert path == models.Store(out=io.StringIO()).path("tiny-llama")
    status, data, _ = model(capsys, "path", "tiny")
    assert status == 0 and data == {"name": "tiny-llama", "path": str(path)}


def test_what_is_neither_a_name_nor_a_reference_is_e014_and_an_unknown_name_e010(cache, capsys):
    for typed in ("a b", "../x", ""):
        status, _, err = model(capsys, "path", typed)
        assert status == errors.BadModelName.exit_status and "E014" in err and "--name" not in err, (typed, err)
    status, _, err = model(capsys, "path", "no-such-model")
    assert status == errors.UnknownModel.exit_status and "model list" in err and "model pull no-such-model" not in err


def test_a_serve_of_name_tag_calls_the_model_by_its_store_name(tmp_path):
    from provision.serve import engine

    blob = tmp_path / "sha256-x"
    assert engine.model_alias("kquant:latest", blob) == "kquant-latest"  # was "model"
    assert engine.model_alias("ollama://127.0.0.1:5000/kquant:latest", blob) == "kquant-latest"
    assert engine.model_alias("tiny-llama", blob) == "tiny-llama"


def test_a_pulled_model_whose_file_went_missing_is_pulled_again_by_its_source(cache, server, tiny, capsys):
    registries.publish_ollama(server, tiny, repo="library/kquant", tag="latest")
    source = f"ollama://{host(server)}/library/kquant:latest"
    assert cli.main(["model", "pull", source]) == 0
    blob = cache / "blobs" / f"sha256-{hashlib.sha256(tiny).hexdigest()}"
    blob.chmod(0o644)
    blob.unlink()
    status, _, err = model(capsys, "path", "kquant:latest")
    assert status == errors.UnknownModel.exit_status
    fix = f"provision model pull {source} --name kquant-latest"
    assert f"fix: {fix}" in err  # `pull kquant-latest` would be E010: the name is no reference
    assert cli.main(fix.split()[1:]) == 0
    status, data, _ = model(capsys, "path", "kquant:latest")
    assert status == 0 and Path(data["path"]).read_bytes() == tiny


def test_a_dry_run_plans_a_split_model_where_the_run_links_it_and_a_damaged_ref_as_the_run_refuses_it(cache):
    from provision.models.records import Ref

    (cache / "refs").mkdir(parents=True)
    parts = [{"sha256": f"{k}" * 64, "size": 10, "file": f"big-Q4_K_M-{k:05d}-of-00002.gguf"} for k in (1, 2)]
    ref = Ref("big", parts[0]["sha256"], 20, "https://127.0.0.1/big.gguf", False, None, parts=parts)
    (cache / "refs" / "big.json").write_text(json.dumps(ref.as_dict()))
    before = sorted(cache.rglob("*"))
    assert resolve_model("big", fetch=False) == cache / "split" / "big" / "big-Q4_K_M-00001-of-00002.gguf"
    (cache / "refs" / "broken.json").write_text("{not json")
    with pytest.raises(errors.ModelHashMismatch, match="damaged ref") as caught:
        resolve_model("broken", fetch=False)
    assert caught.value.fix == "provision model rm broken, then pull it again"
    assert sorted(cache.rglob("*")) == [*before, cache / "refs" / "broken.json"]  # nothing made, nothing linked
