"""The settings: one frozen object layered from defaults, two TOML files, PROVISION_* and --set, with
where each value came from; `provision config show` and `provision doctor` print it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors, settings


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    system, user = tmp_path / "etc" / "config.toml", tmp_path / "home" / "config.toml"
    system.parent.mkdir()
    user.parent.mkdir()
    monkeypatch.setenv(settings.SYSTEM_FILE_ENV, str(system))
    monkeypatch.setenv(settings.USER_FILE_ENV, str(user))
    for spec in settings.SPECS:
        monkeypatch.delenv(spec.env, raising=False)
    monkeypatch.setenv("PROVISION_CACHE", str(tmp_path / "cache"))
    return system, user


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, str]]:
    assert cli.main([*argv, "config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["command"], shown["status"]) == ("config show", "ok")
    return {r["key"]: r for r in shown["data"]["settings"]}


def test_each_layer_overrides_the_one_below_and_says_so(files, capsys, monkeypatch):
    system, user = files
    system.write_text('accel = "kvm"\ngpu_slots = 3\nstall_s = 5\nguest_debug = true\n')
    user.write_text('accel = "tcg"\ngpu_slots = 6\n')
    monkeypatch.setenv("PROVISION_GPU_SLOTS", "4")
    rows = _show(capsys, "--set", "stall_s=7")
    assert (rows["accel"]["value"], rows["accel"]["source"]) == ("tcg", f"user file {user}")
    assert (rows["gpu_slots"]["value"], rows["gpu_slots"]["source"]) == ("4", "environment PROVISION_GPU_SLOTS")
    assert (rows["stall_s"]["value"], rows["stall_s"]["source"]) == ("7", "flag --set stall_s")
    assert (rows["guest_debug"]["value"], rows["guest_debug"]["source"]) == ("1", f"system file {system}")
    assert rows["podman_isolation"]["source"] == "default" and rows["state"]["source"] == "default"
    assert set(rows) == {s.key for s in settings.SPECS}
    # Without the files and the flag, the same keys fall back to their defaults.
    system.unlink()
    user.unlink()
    rows = _show(capsys)
    assert rows["accel"]["source"] == rows["stall_s"]["source"] == "default" and rows["stall_s"]["value"] == "20"


def test_a_file_value_reaches_the_code_that_uses_it(files, capsys, tmp_path):
    _, user = files
    store = tmp_path / "elsewhere"
    user.write_text(f'cache = "{store}"\n')
    # the environment's PROVISION_CACHE is above the file: --set is above both
    assert cli.main(["--set", f"cache={store}", "model", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["store"] == str(store / "models")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('accel = "fast"\n', "accel = 'fast': expected one of kvm, tcg"),
        ("gpu_slots = 0\n", "gpu_slots = '0': expected a positive integer"),
        ('colour = "red"\n', "unknown key 'colour'"),
        ("accel = [1]\n", "accel is a list"),
        ("accel = \n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_e003_naming_the_file_and_key(files, capsys, text, said):
    _, user = files
    user.write_text(text)
    assert cli.main(["stacks"]) == errors.InvalidValue.exit_status
    err = capsys.readouterr().err
    assert err.startswith(f"E003: user file {user}: ") and said in err and "\n  fix: " in err


def test_a_bad_flag_or_variable_is_e003(files, capsys, monkeypatch):
    assert cli.main(["--set", "nope=1", "stacks"]) == errors.InvalidValue.exit_status
    assert "E003: --set 'nope=1': expected KEY=VALUE" in capsys.readouterr().err
    monkeypatch.setenv("PROVISION_ACCEL", "quick")
    assert cli.main(["stacks"]) == errors.InvalidValue.exit_status
    assert "E003: environment PROVISION_ACCEL: accel = 'quick'" in capsys.readouterr().err


def test_load_is_pure_over_what_it_is_given(tmp_path):
    user = tmp_path / "u.toml"
    user.write_text('stall_s = 9\n')
    s = settings.load({"PROVISION_STALL_S": "3"}, ["accel=kvm"], system=tmp_path / "none.toml", user=user)
    assert (s.get("stall_s"), s.source("stall_s")) == ("3", "environment PROVISION_STALL_S")
    assert s.environ() == {"PROVISION_ACCEL": "kvm"}  # what the modules that read PROVISION_* still see
    with pytest.raises(AttributeError):
        s.values = {}  # type: ignore[misc]  # frozen


def test_doctor_lists_every_setting_with_its_source(files, capsys, monkeypatch):
    monkeypatch.setenv("PROVISION_ACCEL", "tcg")
    cli.main(["doctor", "--json"])
    shown = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in shown["data"]["settings"]}
    assert set(rows) == {s.key for s in settings.SPECS}
    assert (rows["accel"]["value"], rows["accel"]["source"]) == ("tcg", "environment PROVISION_ACCEL")
    cli.main(["doctor"])
    text = capsys.readouterr().out
    assert "SETTING" in text and "environment PROVISION_ACCEL" in text


@pytest.mark.parametrize("kind", sorted(settings.XDG))
def test_the_default_directories_are_what_platformdirs_says(kind, monkeypatch, tmp_path):
    import platformdirs

    want = getattr(platformdirs, f"user_{kind}_dir")
    monkeypatch.delenv(settings.XDG[kind][0], raising=False)
    assert settings.user_dir(kind) == want(settings.APP)
    monkeypatch.setenv(settings.XDG[kind][0], str(tmp_path))
    assert settings.user_dir(kind) == want(settings.APP) == str(tmp_path / settings.APP)
