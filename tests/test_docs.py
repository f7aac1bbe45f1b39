"""The README and entry points stay true: error table, settings table, the two commands, Taskfile tasks."""

from __future__ import annotations

import re

import yaml

from provision.core import errors, settings


def errors_table() -> str:
    rows = [f"| {c.code} | {c.exit_status} | {c.__name__} | {c.summary} |" for c in errors.all_errors()]
    return "\n".join(["| code | exit | name | meaning |", "|---|---|---|---|", *rows])


def test_readme_error_table_matches_errors_py(repo):
    text = (repo / "README.md").read_text()
    m = re.search(r"<!-- errors-table[^>]*-->\n(.*?)\n<!-- /errors-table -->", text, re.S)
    assert m, "README lost its errors-table markers"
    assert m.group(1) == errors_table(), "run: python -m tests.test_docs > fix README (see __main__ below)"


def settings_table() -> str:
    rows = [f"| `{s.key}` | `{s.env}` | {s.kind.name} | {s.default_text()} | {s.help} |" for s in settings.SPECS]
    return "\n".join(["| key | variable | type | default | what |", "|---|---|---|---|---|", *rows])


def test_readme_settings_table_matches_settings_py(repo):
    text = (repo / "README.md").read_text()
    m = re.search(r"<!-- settings-table[^>]*-->\n(.*?)\n<!-- /settings-table -->", text, re.S)
    assert m, "README lost its settings-table markers"
    assert m.group(1) == settings_table(), "run: python -m tests.test_docs settings > fix README"


def test_readme_names_the_two_commands_and_ci_runs_the_test_one(repo):
    readme = (repo / "README.md").read_text()
    assert "bash scripts/main" in readme and "bash scripts/test" in readme
    assert "bash scripts/test" in (repo / ".ci/run").read_text()


def test_taskfile_has_the_documented_tasks(repo):
    tasks = yaml.safe_load((repo / "Taskfile.yml").read_text())["tasks"]
    assert {"test", "lint", "image:build", "krun:install"} <= set(tasks)


if __name__ == "__main__":
    import sys

    print(settings_table() if sys.argv[1:] == ["settings"] else errors_table())


def test_readme_layout_table_names_every_package_and_only_real_ones(repo):
    readme = (repo / "README.md").read_text()
    layout = readme[readme.index("## Layout") : readme.index("## What was verified where")]
    named = set(re.findall(r"`(provision/[a-z_/]+/)`", layout))
    packages = {
        f"{p.parent.relative_to(repo).as_posix()}/"
        for p in (repo / "provision").rglob("__init__.py")
        if p.parent != repo / "provision" and p.parent.name != "__pycache__"
    } - {"provision/hosts/"}
    assert packages - named == set(), "packages missing from README's layout table"
    assert {n for n in named if not (repo / n).is_dir()} == set(), "layout table names folders that do not exist"


def test_readme_quick_start_shows_the_ramalama_words_and_each_parses(repo):
    import shlex

    from provision import cli

    readme = (repo / "README.md").read_text()
    m = re.search(r"<!-- quick-start -->\n```sh\n(.*?)```\n<!-- /quick-start -->", readme, re.S)
    assert m, "README lost its quick-start block"
    lines = [shlex.split(line, comments=True) for line in m.group(1).splitlines()]
    words = {argv[1] for argv in lines}
    assert {"pull", "list", "rm", "inspect", "info", "version", "run"} <= words
    for argv in lines:
        assert argv[0] == "provision"
        args = cli.build_parser(argv[1], full=False).parse_args(argv[1:])  # E003 for a command that is not one
        assert args.command == argv[1]
    assert ["provision", "run", "tiny-llama", "--gpu"] in lines  # run MODEL: serve and chat
    assert ["provision", "serve", "tiny-llama", "--gpu", "--detach"] in lines  # serve MODEL
