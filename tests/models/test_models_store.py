"""The synthetic tiny-llama, ensure() for image builds, list/verify/rm and the pins' model entries."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors, pins
from provision.models import store as models


@pytest.fixture
def cache(empty_cache: Path) -> Path:
    return empty_cache / "models"


def tiny_pin() -> pins.ModelPin:
    return pins.default().models[models.SMOKE_MODEL]


def test_synth_twice_writes_identical_bytes_equal_to_the_pin(tmp_path, capsys):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert cli.main(["model", "synth", "tiny-llama", "--output", str(a)]) == 0
    assert cli.main(["model", "synth", "tiny-llama", "--output", str(b), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.split("\n", 2)[-1])["data"]
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes()[:4] == b"GGUF"
    assert hashlib.sha256(a.read_bytes()).hexdigest() == tiny_pin().sha256 == report["sha256"]
    assert a.stat().st_size == tiny_pin().size
    assert tiny_pin().status == "COMPUTED" and tiny_pin().synth == "tiny-llama"


def test_synth_into_the_store_gives_a_path_and_ensure_returns_the_verified_blob(cache, capsys):
    assert cli.main(["model", "synth", "tiny-llama"]) == 0
    capsys.readouterr()
    assert cli.main(["model", "path", "tiny-llama"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == cache / "blobs" / f"sha256-{tiny_pin().sha256}"
    assert models.ensure("tiny-llama") == path


def test_ensure_synthesizes_the_smoke_model_offline_when_missing(cache):
    path = models.ensure(models.SMOKE_MODEL)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == tiny_pin().sha256
    assert models.SMOKE_MODEL in models.catalog_names() and models.DEFAULT_MODEL in models.catalog_names()


def test_unpinned_gguf_version_refuses_to_write(tmp_path, cache):
    data = json.loads(pins.default_path().read_text())
    data["python"]["gguf"] = "0.0.1"
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    store = models.Store(pins=pins.load(path))
    out = tmp_path / "never.gguf"
    with pytest.raises(errors.ToolMissing) as exc:
        store.synth_to("tiny-llama", out)
    assert "gguf==0.0.1" in exc.value.message and "python.gguf" in exc.value.message
    assert not out.exists()


def test_synth_whose_bytes_differ_from_the_pin_keeps_nothing(tmp_path, cache):
    data = json.loads(pins.default_path().read_text())
    data["models"]["tiny-llama"]["sha256"] = "0" * 64
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    store = models.Store(pins=pins.load(path))
    with pytest.raises(errors.ModelHashMismatch):
        store.synth("tiny-llama")
    assert list((cache / "blobs").iterdir()) == [] and list((cache / "partial").iterdir()) == []


def test_verify_detects_a_corrupted_blob(cache, capsys):
    path = models.ensure("tiny-llama")
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert cli.main(["model", "verify"]) == errors.ModelHashMismatch.exit_status
    captured = capsys.readouterr()
    assert "BAD  tiny-llama" in captured.out and "E011" in captured.err
    with pytest.raises(errors.ModelHashMismatch):
        models.ensure("tiny-llama")


def test_list_marks_defaults_and_says_read_pins_were_never_downloaded(cache, capsys):
    models.ensure("tiny-llama")
    assert cli.main(["model", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["data"]["models"]}
    qwen = rows[models.DEFAULT_MODEL]
    assert qwen["default"] and qwen["pin_status"] == "READ" and not qwen["stored"]
    assert "never downloaded" in qwen["note"]
    assert rows["tiny-llama"]["stored"] and rows["tiny-llama"]["smoke_default"]
    assert cli.main(["model", "list"]) == 0
    assert "never downloaded" in capsys.readouterr().out


def test_rm_keeps_a_blob_another_name_uses(cache, capsys):
    store = models.Store()
    store.synth("tiny-llama")
    blob = store.path("tiny-llama")
    # a second name for the same bytes, as a pull --name would write it
    ref = json.loads((cache / "refs" / "tiny-llama.json").read_text())
    (cache / "refs" / "other.json").write_text(json.dumps({**ref, "name": "other"}))
    assert cli.main(["model", "rm", "tiny-llama"]) == 0
    assert blob.exists() and store.ref("tiny-llama") is None
    assert cli.main(["model", "rm", "other"]) == 0
    assert not blob.exists()
    assert cli.main(["model", "rm", "other"]) == errors.UnknownModel.exit_status
    assert cli.main(["model", "path", "other"]) == errors.UnknownModel.exit_status


def test_pins_reject_a_synth_model_with_a_download_reference(tmp_path):
    data = json.loads(pins.default_path().read_text())
    data["models"]["tiny-llama"]["hf"] = "hf://a/b/c.gguf@main"
    path = tmp_path / "pins.json"
    path.write_text(json.dumps(data))
    with pytest.raises(errors.InvalidValue) as exc:
        pins.load(path)
    assert "models.tiny-llama.hf" in exc.value.message


def test_pull_of_the_synthetic_catalog_name_synthesizes_it(cache, capsys):
    assert cli.main(["model", "pull", "tiny-llama", "--name", "smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["data"]
    assert report["name"] == "smoke" and report["sha256"] == tiny_pin().sha256 and report["fetched_bytes"] == 0
    assert report["source"] == "synth:tiny-llama"
    assert models.Store().path("smoke") == cache / "blobs" / f"sha256-{tiny_pin().sha256}"


def test_list_shows_sizes_in_human_units_and_json_keeps_bytes(cache, capsys):
    models.ensure("tiny-llama")
    assert cli.main(["model", "list"]) == 0
    text = capsys.readouterr().out
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    qwen, tiny = pins.default().models[models.DEFAULT_MODEL], tiny_pin()
    assert str(qwen.size) not in text and str(tiny.size) not in text  # no raw byte counts
    assert re.search(r"\b\d+(\.\d)? (MB|GB)\b", rows[models.DEFAULT_MODEL]), rows[models.DEFAULT_MODEL]
    assert re.search(r"\b\d+(\.\d)? (kB|MB)\b", rows["tiny-llama"]), rows["tiny-llama"]
    assert cli.main(["model", "list", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)["data"]["models"]}
    assert listed["tiny-llama"]["size"] == tiny.size


@pytest.mark.parametrize(
    "size,shown",
    [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (933504, "934 kB"), (88201792, "88 MB"), (491400032, "491 MB"),
     (2019377600, "2.0 GB"), (None, "-")],
)
def test_size_text_is_decimal_like_ollama_list(size, shown):
    from provision.models.fetch import size_text

    assert size_text(size) == shown
