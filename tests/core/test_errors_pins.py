
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


def test_pins_file_loads_and_names_the_llama_cpp_source_once():
    p = pins.load()
    llama = p.source("llama-cpp")
    sdist = p.source("llama-cpp-python-sdist")
    assert llama["rev"] == sdist["vendored_rev"]
    assert sdist["sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"



def test_bad_hash_is_rejected_naming_file_key_and_value(tmp_path):
    path = pins_file_with(tmp_path, lambda d: d["sources"]["moltenvk"].__setitem__("hash", "sha256-short"))
    with pytest.raises(errors.InvalidValue) as exc:
        pins.load(path)
    assert str(path) in exc.value.message
    assert "sources.moltenvk.hash" in exc.value.message
    assert "sha256-short" in exc.value.message


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
