"""The command face: what `provision --help` tells a user, one-line help and an example everywhere."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision import cli
from provision.core import errors


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, str]]:
    """(command path, one-line help, epilog) of every command and subcommand."""
    out = []
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            out.append(((*path, name), helps.get(name, ""), sub.epilog or ""))
            out += _walk(sub, (*path, name))
    return out


def test_top_help_says_what_the_tool_is_for_a_user() -> None:
    text = cli.build_parser().format_help()
    assert "GPU llama.cpp in Linux guests" in text
    assert "quick start" in text and "provision image llama-linux" in text
    assert "Thin command line" not in text  # not the CLI module's docstring


def test_every_command_has_a_one_line_help_and_an_example() -> None:
    commands = _walk(cli.build_parser())
    assert len(commands) >= 20
    for path, help_text, epilog in commands:
        assert help_text and "\n" not in help_text, path
        assert epilog.startswith("example:") and f"provision {path[0]}" in epilog, path


@pytest.mark.parametrize(
    ("argv", "expanded"),
    [
        (["image", "llama"], ["image", "build", "llama"]),
        (["image", "llama-linux", "--model", "tiny-llama"], ["image", "build", "llama-linux", "--model", "tiny-llama"]),
        (["image", "render", "llama"], ["image", "render", "llama"]),
        (["image", "--help"], ["image", "--help"]),
        (["run", "image"], ["run", "image"]),
    ],
)
def test_image_short_form_is_image_build(argv: list[str], expanded: list[str]) -> None:
    assert cli.expand_short_forms(argv) == expanded


def test_short_form_reaches_the_build_handler() -> None:
    args = cli.build_parser().parse_args(cli.expand_short_forms(["image", "llama", "--json"]))
    assert args.func.__name__ == "run_build" and args.stack == "llama" and args.json


def test_help_imports_no_domain_package() -> None:
    # A fresh interpreter: `--help` loads the CLI and a few constant tables (choices, defaults),
    # never a template engine, a YAML parser, the model store, a host backend or doctor.
    code = (
        "import sys, contextlib, io\n"
        "from provision import cli\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['--help'])\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    heavy = ("jinja2", "yaml", "plumbum", "provision.models", "provision.images", "provision.hosts",
             "provision.doctor")
    assert [m for m in loaded if m.startswith(heavy)] == []
    assert "provision.cli.model" in loaded  # the probe saw the command modules being loaded


def test_the_light_parser_lists_the_same_commands_and_fully_builds_the_one_asked_for() -> None:
    full = cli.build_parser()
    light = cli.build_parser(None, full=False)
    assert _subparsers(light).keys() == _subparsers(full).keys()
    for name in _subparsers(full):
        one = _subparsers(cli.build_parser(name, full=False))[name]
        assert one.format_help() == _subparsers(full)[name].format_help(), name
    assert cli._command_of(["--json", "stacks"]) == "stacks" and cli._command_of(["--version"]) is None


def test_each_command_module_is_listed_with_exactly_its_commands() -> None:
    for name, words in cli.COMMAND_MODULES.items():
        assert tuple(importlib.import_module(f"provision.cli.{name}").COMMANDS) == words, name


def test_a_named_command_builds_its_own_parser_alone() -> None:
    assert list(_subparsers(cli.build_parser("ps", full=False))) == ["serve", "ps", "stop", "shell"]  # its module's
    assert len(_subparsers(cli.build_parser("no-such-command", full=False))) == len(_subparsers(cli.build_parser()))
    with pytest.raises(errors.InvalidValue, match="invalid choice"):
        cli.build_parser("no-such-command", full=False).parse_args(["no-such-command"])


_MODULES_AFTER = (
    "import sys, contextlib, io\n"
    "from provision import cli\n"
    "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
    "    cli.main(sys.argv[1:])\n"
    "print(' '.join(sorted(sys.modules)))\n"
)


@pytest.mark.parametrize("argv", [["model", "list"], ["model", "path", "tiny-llama"], ["model", "pull", "--help"]])
def test_model_commands_that_make_no_request_do_not_import_requests(argv: list[str], tmp_path: Path) -> None:
    # requests with its dependencies is about 0.08 s of start-up: loaded at the first request only.
    env = {**os.environ, "PROVISION_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *argv], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    assert "provision.models.store" in out or argv[-1] == "--help"  # the store was loaded where it is used
    assert [m for m in out if m.split(".")[0] in ("requests", "urllib3", "charset_normalizer")] == []


def test_the_first_request_imports_requests(tmp_path: Path) -> None:
    # The other side of the test above: the probe sees requests once a request is made (a refused
    # port on loopback is still a request through requests).
    code = (
        "import sys\n"
        "from provision.adapters import http as web\n"
        "before, kind = 'requests' in sys.modules, None\n"
        "try:\n"
        "    web.get('http://127.0.0.1:9/x', connect_timeout=2)\n"
        "except OSError as exc:\n"
        "    kind = type(exc).__name__\n"
        "print(before, 'requests' in sys.modules, kind)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "ConnectionError"]
