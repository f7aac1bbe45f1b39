
import base64
import hashlib
import json
import re

import pytest

from provision.core import errors, pins
from tests.helpers import pins_file_with


def test_error_codes_and_exit_statuses_are_unique():
    classes = errors.all_errors()
    codes = [c.code for c in classes]
    statuses = [c.exit_status for c in classes]
    assert len(codes) == len(set(codes)), codes
    assert len(statuses) == len(set(statuses)), statuses
    assert errors.GpuNotSupported.code == "E007"


def _strings(node, where=""):
    """(dotted key, value) of every string in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, f"{where}.{k}" if where else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(node, str):
        yield where, node


def test_pins_file_loads_and_names_the_llama_cpp_source_once():
    p = pins.load()
    data = json.loads(pins.default_path().read_text())
    # One source fetches llama.cpp itself; the sdist only says which of its revs it vendors.
    fetched = [name for name, src in data["sources"].items() if src.get("repo") == "llama.cpp"]
    assert fetched == ["llama-cpp"]
    rev = p.source("llama-cpp")["rev"]
    assert re.fullmatch(r"[0-9a-f]{40}", rev)
    where = sorted(key for key, value in _strings(data) if rev in value)
    assert where == ["sources.llama-cpp-python-sdist.vendored_rev", "sources.llama-cpp.rev"], where
    sdist = p.source("llama-cpp-python-sdist")
    assert re.fullmatch(r"[0-9a-f]{64}", sdist["sha256"]) and sdist["filename"].endswith(f"-{sdist['version']}.tar.gz")


@pytest.mark.slow
def test_the_pinned_sdist_is_the_file_provision_fetches():
    # The pin against the bytes (fetched from PyPI once, then cached), hashed here, not by provision.
    from provision.images import sources

    sdist = pins.load().source("llama-cpp-python-sdist")
    path = sources.sdist_path()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == sdist["sha256"] and path.stat().st_size == sdist["size"]



def test_bad_hash_is_rejected_naming_file_key_and_value(tmp_path):
    path = pins_file_with(tmp_path, lambda d: d["sources"]["moltenvk"].__setitem__("hash", "sha256-short"))
    with pytest.raises(errors.InvalidValue) as exc:
        pins.load(path)
    assert str(path) in exc.value.message
    assert "sources.moltenvk.hash" in exc.value.message
    assert "sha256-short" in exc.value.message


def test_a_hex_sha256_and_its_sri_hash_must_be_the_same_digest(tmp_path):
    # the Venus tree's hash is the tap formula's hex sha256, written as fetchurl's SRI hash
    venus = pins.load(pins.default_path()).raw["sources"]["virglrenderer-venus"]
    assert venus["hash"] == "sha256-" + base64.b64encode(bytes.fromhex(venus["sha256"])).decode()
    path = pins_file_with(tmp_path, lambda d: d["sources"]["virglrenderer-venus"].__setitem__("sha256", "0" * 64))
    with pytest.raises(errors.InvalidValue) as exc:
        pins.load(path)
    assert "sources.virglrenderer-venus.hash" in exc.value.message and "not sha256 in SRI form" in exc.value.message
    assert exc.value.fix


def test_unverified_pin_refuses_the_component_that_needs_it(tmp_path):
    path = pins_file_with(tmp_path, lambda d: d["sources"]["krunkit"].__setitem__("status", "UNVERIFIED"))
    loaded = pins.load(path)
    with pytest.raises(errors.UnverifiedPin) as exc:
        loaded.require("krunkit", purpose="the krunkit package")
    assert "sources.krunkit" in exc.value.message and "UNVERIFIED" in exc.value.message


def test_malformed_pins_json_names_line(tmp_path):
    path = tmp_path / "pins.json"
    path.write_text('{"sources": {')
    with pytest.raises(errors.CatalogSyntaxError) as exc:
        pins.load(path)
    assert str(path) in exc.value.message
