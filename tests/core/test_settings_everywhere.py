"""Every ``PROVISION_*`` variable is a declared setting, read in one place: no module but
provision/core/settings.py reads one from an environment (the env handed to a child may still be
written), each bad value is E003 naming where it was, and each module sees its setting from the
environment, a config file or ``--set`` at the moment it asks."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provision.core import errors, settings

PACKAGE = Path(__file__).resolve().parents[2] / "provision"
SETTINGS_FILE = PACKAGE / "core" / "settings.py"
# Named in provision/ without being a setting, and why.
NOT_SETTINGS = {
    "PROVISION_MODEL": "written into the guest's environment for the job (macOS route), never read here",
    settings.SYSTEM_FILE_ENV: "where the system config file is (read by core/settings.py itself)",
    settings.USER_FILE_ENV: "where the user's config file is (read by core/settings.py itself)",
}
READ_METHODS = {"get", "pop", "getenv", "setdefault"}


def _is_env_name(node: ast.AST, names: set[str]) -> bool:
    """Does ``node`` spell a PROVISION_* variable: a literal, an f-string starting so, a constant
    that holds one (``ENV_VAR``, ``tools.ENV_VAR``) or a spec's ``.env``?"""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith("PROVISION_")
    if isinstance(node, ast.JoinedStr):
        return bool(node.values) and _is_env_name(node.values[0], names)
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in names or node.attr == "env"
    return False


def env_constants(trees: dict[str, ast.Module]) -> set[str]:
    """Module-level names anywhere in the package bound to a PROVISION_* name (to a fixpoint:
    ``HOST_TOOLS_ENV = host_tools.ENV_VAR``)."""
    names: set[str] = set()
    while True:
        found = {
            target.id
            for tree in trees.values()
            for stmt in tree.body
            if isinstance(stmt, ast.Assign) and any(_is_env_name(n, names) for n in ast.walk(stmt.value))
            for target in stmt.targets
            if isinstance(target, ast.Name)
        }
        if found <= names:
            return names
        names |= found


def env_reads(tree: ast.Module, names: set[str]) -> list[int]:
    """Lines where ``tree`` reads a PROVISION_* variable from a mapping (``.get``/``.pop``/``getenv``,
    ``m[K]`` as a value, ``K in m``); writing one (``env[K] = v``, a dict literal) is no read."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READ_METHODS:
            hit = bool(node.args) and _is_env_name(node.args[0], names)
        elif isinstance(node, ast.Subscript):
            hit = isinstance(node.ctx, ast.Load) and _is_env_name(node.slice, names)
        elif isinstance(node, ast.Compare):
            hit = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and _is_env_name(node.left, names)
        else:
            continue
        if hit:
            lines.append(node.lineno)
    return lines


def _trees() -> dict[str, ast.Module]:
    return {p.relative_to(PACKAGE.parent).as_posix(): ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}


def test_no_module_but_settings_reads_a_provision_variable_from_the_environment():
    trees = _trees()
    names = env_constants(trees)
    found = {path: lines for path, tree in trees.items()
             if PACKAGE.parent / path != SETTINGS_FILE and (lines := env_reads(tree, names))}  # fmt: skip
    assert found == {}, "read settings.current() (provision/core/settings.py) instead of os.environ"


@pytest.mark.parametrize(
    ("source", "reads"),
    [
        ('import os\nx = os.environ.get("PROVISION_ACCEL")\n', True),
        ('import os\nx = os.getenv("PROVISION_ACCEL")\n', True),
        ('import os\nENV_VAR = "PROVISION_HOST_TOOLS"\ndef f(env):\n    return env.get(ENV_VAR)\n', True),
        ('import os\nx = os.environ["PROVISION_APIR_HOST_GGML"]\n', True),
        ('import os\nx = "PROVISION_ACCEL" in os.environ\n', True),
        ('import os\nx = os.environ.get(f"PROVISION_{1}")\n', True),
        ('env = {}\nenv["PROVISION_MODEL"] = "/models/m.gguf"\n', False),  # a child's environment, written
        ('x = {"PROVISION_CACHE": "/c"}\nfix = "set PROVISION_CACHE"\n', False),
        ('import os\nx = os.environ.get("HOME")\n', False),
    ],
)
def test_the_read_check_sees_each_way_of_reading_and_lets_writes_pass(source, reads):
    tree = ast.parse(source)
    assert bool(env_reads(tree, env_constants({"m.py": tree}))) is reads


def test_every_provision_variable_named_in_the_package_is_a_declared_setting():
    declared = {s.env for s in settings.SPECS}
    assert len(declared) == len(settings.SPECS) and all(e.startswith("PROVISION_") for e in declared)
    assert len({s.key for s in settings.SPECS}) == len(settings.SPECS)
    named = {m for p in PACKAGE.rglob("*") if p.suffix in (".py", ".conf") and p != SETTINGS_FILE
             for m in re.findall(r"\bPROVISION_[A-Z][A-Z0-9_]*", p.read_text())}  # fmt: skip
    assert named - declared - set(NOT_SETTINGS) == set(), "declare it in provision/core/settings.py SPECS"


def test_every_setting_has_a_kind_a_description_and_a_good_example():
    for spec in settings.SPECS:
        assert spec.help and spec.kind.name and spec.example, spec.key
        assert spec.check(spec.example) is None, f"{spec.key}: its example {spec.example!r} is not a good value"
        default = spec.default() if callable(spec.default) else spec.default
        assert isinstance(spec.default, str) != bool(spec.default_note), f"{spec.key}: a fixed default or a note"
        assert default is None or spec.check(default) is None, f"{spec.key}: its default is not a good value"


BAD = {"path": " ", "integer >= 1": "0", "seconds": "soon", "size": "lots", "0 or 1": "yes", "host[:port]": "a b"}


def _bad(spec: settings.Spec) -> str:
    return BAD.get(spec.kind.name, "no-such-choice")


@pytest.mark.parametrize("spec", settings.SPECS, ids=[s.key for s in settings.SPECS])
def test_a_bad_value_is_e003_whose_fix_names_the_variable_or_key_where_it_was(spec, tmp_path):
    none = tmp_path / "none.toml"
    bad = _bad(spec)
    with pytest.raises(errors.InvalidValue) as env_err:
        settings.load({spec.env: bad}, system=none, user=none)
    assert f"environment {spec.env}: {spec.key} = {bad!r}: expected" in env_err.value.message
    assert spec.env in env_err.value.fix and "unset it" in env_err.value.fix
    user = tmp_path / "config.toml"
    user.write_text(f'{spec.key} = "{bad}"\n')
    with pytest.raises(errors.InvalidValue) as file_err:
        settings.load({}, system=none, user=user)
    assert f"user file {user}: {spec.key} = {bad!r}" in file_err.value.message
    assert str(user) in file_err.value.fix and f"{spec.key} = " in file_err.value.fix
    with pytest.raises(errors.InvalidValue) as flag_err:
        settings.load({}, [f"{spec.key}={bad}"], system=none, user=none)
    assert f"--set {spec.key}=" in flag_err.value.fix
    assert env_err.value.code == file_err.value.code == flag_err.value.code == "E003"


def _readers(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, Callable[[], Any], Any]]:
    """setting -> (a value, what the module that uses it reads, what it should read)."""
    from provision.adapters import podman
    from provision.core import catalog, layout, paths
    from provision.hosts import RunRequest
    from provision.hosts.linux.apir import host_side
    from provision.hosts.linux.run import accel, slots
    from provision.hosts.linux.run import facts as linux
    from provision.hosts.linux.tools import host_tools
    from provision.images import announce
    from provision.images import build as images
    from provision.models import download, fetch, shortnames

    monkeypatch.setattr(podman, "probe_host", lambda: podman.HostFacts("cgroup2fs", True, False))
    monkeypatch.setattr(linux, "_tools", lambda _stack, _gpu: host_tools.HostTools(tmp, "host"))
    (tmp / "dev").mkdir(exist_ok=True)
    (tmp / "dev/kvm").touch()
    stack = catalog.load().get("llama-linux")
    return {
        "cache": (str(tmp / "c"), paths.cache_root, tmp / "c"),
        "state": (str(tmp / "s"), paths.state_root, tmp / "s"),
        "data_root": (str(tmp / "d"), layout.templates_dir, tmp / "d" / "containerfiles"),
        "host_tools": (str(tmp), lambda: host_tools.locate().root, tmp),  # type: ignore[union-attr]
        "accel": ("kvm", lambda: accel.for_run(root=tmp).accel, "kvm"),
        "gpu_slots": ("5", slots.slot_count, 5),
        "guest_debug": ("1", lambda: linux.gather(RunRequest(stack, False, ("true",)), dry_run=True).guest_debug,
                        True),  # fmt: skip
        "apir_host_ggml": (str(tmp), host_side.own_ggml, tmp),
        "stall_s": ("0.5", download.stall_seconds, 0.5),
        "podman_isolation": ("oci", lambda: images.host_flags().isolation, "oci"),
        "ask_above": ("1K", fetch.ask_threshold, 1024),
        "ask_builds": ("0", announce.asks, False),
        "shortnames": (str(tmp / "mine.conf"), shortnames.user_file, tmp / "mine.conf"),
        "ollama_registry": ("reg.example:5000", lambda: shortnames.registry("ollama"), "reg.example:5000"),
        "docker_registry": ("reg.example:5001", lambda: shortnames.registry("docker"), "reg.example:5001"),
    }


@pytest.fixture
def bare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No setting in the environment, an empty user file and no system file."""
    for spec in settings.SPECS:
        monkeypatch.delenv(spec.env, raising=False)
    user = tmp_path / "user.toml"
    user.write_text("")
    monkeypatch.setenv(settings.USER_FILE_ENV, str(user))
    monkeypatch.setenv(settings.SYSTEM_FILE_ENV, str(tmp_path / "no-system.toml"))
    yield user


def test_every_setting_has_a_reader_below(tmp_path, monkeypatch):
    assert set(_readers(tmp_path, monkeypatch)) == set(settings.BY_KEY)


@pytest.mark.parametrize("key", [s.key for s in settings.SPECS])
def test_each_module_reads_its_setting_from_the_environment_a_file_or_set_when_it_asks(key, bare, tmp_path,
                                                                                       monkeypatch):  # fmt: skip
    value, read, want = _readers(tmp_path, monkeypatch)[key]
    env = settings.BY_KEY[key].env
    monkeypatch.setenv(env, value)  # a test's setenv counts at once: nothing built earlier masks it
    assert read() == want
    monkeypatch.delenv(env)
    bare.write_text(f'{key} = "{value}"\n')  # the user's config file, outside any command
    assert read() == want and settings.current().source(key) == f"user file {bare}"
    bare.write_text("")
    with settings.installed(settings.load(flags=[f"{key}={value}"])):  # what main() does with --set
        assert read() == want
    # The command's object is gone with it: the environment counts again.
    assert settings.current().source(key) == "default"


def test_main_installs_the_commands_settings_only_for_that_command(bare, monkeypatch, capsys):
    from provision import cli

    assert cli.main(["--set", "gpu_slots=7", "config", "show", "--json"]) == 0
    assert '"gpu_slots"' in capsys.readouterr().out
    assert settings.current().source("gpu_slots") == "default"
    monkeypatch.setenv("PROVISION_GPU_SLOTS", "3")
    assert settings.current().typed.gpu_slots == 3 and "PROVISION_GPU_SLOTS" not in settings.current().environ()


def test_config_show_gives_each_setting_its_type_and_source(bare, capsys):
    import json

    from provision import cli

    assert cli.main(["--set", "accel=tcg", "config", "show", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)["data"]["settings"]}
    assert set(rows) == set(settings.BY_KEY)
    assert (rows["accel"]["source"], rows["accel"]["type"]) == ("flag --set accel", "kvm/tcg")
    assert rows["stall_s"]["type"] == "seconds" and rows["apir_host_ggml"]["env"] == "PROVISION_APIR_HOST_GGML"


def test_the_typed_values_are_the_specs_field_for_field():
    """``Values`` is written out for mypy; it must stay SPECS: same keys, same order, each field's
    type the Spec's kind (Optional exactly where the Spec has no fixed default)."""
    import typing
    from dataclasses import fields

    hints = typing.get_type_hints(settings.Values)
    assert [f.name for f in fields(settings.Values)] == [s.key for s in settings.SPECS]
    for spec in settings.SPECS:
        args = set(typing.get_args(hints[spec.key]))
        optional = type(None) in args
        assert optional == (spec.default is None), spec.key
        base = hints[spec.key] if not optional else typing.Union[tuple(args - {type(None)})]  # noqa: UP007
        if typing.get_origin(base) is typing.Literal:
            assert "/".join(typing.get_args(base)) == spec.kind.name, spec.key  # choice("kvm", "tcg") -> kvm/tcg
        else:
            assert base is spec.kind.python, spec.key


def test_load_gives_each_value_its_python_type(bare):
    s = settings.load(flags=["gpu_slots=3", "stall_s=0.5", "ask_above=1K", "guest_debug=1", "accel=tcg"])
    assert (s.typed.gpu_slots, s.typed.stall_s, s.typed.ask_above, s.typed.guest_debug) == (3, 0.5, 1024, True)
    assert s.typed.accel == "tcg" and s.typed.host_tools is None and isinstance(s.typed.cache, Path)


def _given(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Callable[[settings.Settings], Any]]:
    """setting -> what its module reads, handed the settings instead of looking them up."""
    from provision.core import catalog, layout, paths
    from provision.hosts import RunRequest
    from provision.hosts.linux.apir import host_side
    from provision.hosts.linux.run import accel, slots
    from provision.hosts.linux.run import facts as linux
    from provision.hosts.linux.tools import host_tools
    from provision.images import announce
    from provision.images import build as images
    from provision.models import download, fetch, shortnames

    stack = catalog.load().get("llama-linux")
    return {
        "cache": paths.cache_root,
        "state": paths.state_root,
        "data_root": lambda s: layout.data_root(s) / "containerfiles",
        "host_tools": lambda s: host_tools.locate(settings=s).root,  # type: ignore[union-attr]
        "accel": lambda s: accel.for_run(s, root=tmp).accel,
        "gpu_slots": slots.slot_count,
        "guest_debug": lambda s: linux.gather(RunRequest(stack, False, ("true",)), dry_run=True,
                                              settings=s).guest_debug,  # fmt: skip
        "apir_host_ggml": host_side.own_ggml,
        "stall_s": download.stall_seconds,
        "podman_isolation": lambda s: images.host_flags(s).isolation,
        "ask_above": fetch.ask_threshold,
        "ask_builds": announce.asks,
        "shortnames": shortnames.user_file,
        "ollama_registry": lambda s: shortnames.registry("ollama", s),
        "docker_registry": lambda s: shortnames.registry("docker", s),
    }


@pytest.mark.parametrize("key", [s.key for s in settings.SPECS])
def test_each_module_reads_the_settings_it_is_handed_over_what_is_installed(key, bare, tmp_path, monkeypatch):
    value, read, want = _readers(tmp_path, monkeypatch)[key]
    given = _given(tmp_path, monkeypatch)
    assert set(given) == set(settings.BY_KEY)
    handed = settings.load(flags=[f"{key}={value}"])
    with settings.installed(settings.load()):  # what main installed: the defaults here
        assert given[key](handed) == want
