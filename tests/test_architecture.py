"""The rooms hold: the README's Layout table exactly (every package a row, its docstring saying the
same, its imports that list and nothing more), no cycles, small modules.

Read from the source with ast (function-level imports included), so a lazy import cannot hide a
wrong direction.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "provision"
MAX_LINES = 400

README = PACKAGE.parent / "README.md"
EVERYTHING = "everything"


def package_of(module: str, packages: set[str]) -> str | None:
    """The innermost package of ``packages`` that holds ``module`` (None: the root ``provision``)."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in packages:
            return ".".join(parts[:n])
    return None


def parse_may_import(text: str) -> set[str] | str:
    """``core, adapters`` -> {"provision.core", "provision.adapters"}; "nothing" -> set(); "everything" stays."""
    text = text.strip().rstrip(".")
    if text.startswith(EVERYTHING):
        return EVERYTHING
    if text in ("nothing", "—"):
        return set()
    return {f"provision.{name.strip()}" for name in text.split(",")}


def readme_table() -> dict[str, set[str] | str]:
    """The README's Layout table: package -> what it may import."""
    layout = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str] | str] = {}
    for line in layout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`provision/") and cells[0].endswith("/`"):
            name = cells[0].strip("`/").replace("/", ".")
            if (PACKAGE.parent / cells[0].strip("`") / "__init__.py").is_file():
                table[name] = parse_may_import(cells[2])
    return table


def docstring_may_import(init: Path) -> set[str] | str | None:
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    found = re.search(r"^May import: (.+?)$", doc, re.M)
    return parse_may_import(found.group(1).split(";")[0]) if found else None


def packages() -> set[str]:
    return {module_name(init) for init in PACKAGE.rglob("__init__.py") if init.parent != PACKAGE}


def package_imports(graph: dict[str, set[str]], pkgs: set[str]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import (a package's own sub-packages are its own rows)."""
    out: dict[str, set[str]] = {p: set() for p in pkgs}
    for mod, deps in graph.items():
        here = package_of(mod, pkgs)
        if here is None:
            continue
        for dep in deps:
            there = package_of(dep, pkgs)
            if there is not None and there != here:
                out[here].add(there)
    return out


def violations(graph: dict[str, set[str]], table: dict[str, set[str] | str]) -> list[str]:
    """Imports the table does not allow, and allowances the code does not use (a row that lies)."""
    out = []
    for pkg, uses in package_imports(graph, set(table)).items():
        allowed = table[pkg]
        if allowed == EVERYTHING:
            continue
        assert isinstance(allowed, set)
        out += [f"{pkg} imports {d}, which its row does not allow" for d in sorted(uses - allowed)]
        out += [f"{pkg}'s row allows {d}, which it does not import" for d in sorted(allowed - uses)]
    for mod, deps in graph.items():
        if not mod.startswith("provision.cli") and mod != "provision.__main__":
            out += [f"{mod} imports the CLI ({d})" for d in deps if d.startswith("provision.cli")]
    return sorted(set(out))


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every provision module ``path`` imports, resolved to absolute dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    base = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("provision"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                mod = ".".join(anchor + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("provision"):
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if _is_module(sub) else mod)
    return found


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def all_modules() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Module import cycles (Tarjan's strongly connected components of size > 1)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in graph or w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_package_has_a_readme_row_and_a_docstring_that_says_the_same() -> None:
    table = readme_table()
    assert set(table) == packages()
    said = {module_name(init): docstring_may_import(init) for init in PACKAGE.rglob("__init__.py")
            if init.parent != PACKAGE}  # fmt: skip
    assert said == table


def test_imports_are_exactly_the_readme_table() -> None:
    assert violations(all_modules(), readme_table()) == []


def test_no_package_cycles() -> None:
    pkgs = packages()
    graph = package_imports(all_modules(), pkgs)
    # A package importing its parent (hosts.linux -> hosts: the protocol it implements) is the
    # expected direction; the parent picks its children by name at run time, never by import.
    assert cycles(graph) == []


def test_no_import_cycles() -> None:
    # A package's __init__ importing its own modules is not a cycle of concerns; all others are.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in all_modules().items()}
    assert cycles(graph) == []


def test_no_module_over_the_size_limit() -> None:
    big = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


TOY: dict[str, set[str] | str] = {
    "provision.core": set(),
    "provision.adapters": {"provision.core"},
    "provision.hosts": {"provision.core", "provision.adapters"},
    "provision.cli": EVERYTHING,
}
GOOD = {
    "provision.adapters.a": {"provision.core.errors"},
    "provision.hosts.h": {"provision.adapters.a", "provision.core"},
    "provision.cli.c": {"provision.hosts.h"},
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, []),
        ({"provision.core.x": {"provision.adapters.podman"}},
         ["provision.core imports provision.adapters, which its row does not allow"]),
        ({"provision.adapters.x": {"provision.hosts.h"}},
         ["provision.adapters imports provision.hosts, which its row does not allow"]),
        ({"provision.adapters.x": {"provision.cli"}},
         ["provision.adapters imports provision.cli, which its row does not allow",
          "provision.adapters.x imports the CLI (provision.cli)"]),
    ],
)
def test_the_checker_catches_a_wrong_direction(extra: dict[str, set[str]], expected: list[str]) -> None:
    # The checker itself must be able to fail: feed it a module with a forbidden import.
    assert violations({**GOOD, **extra}, TOY) == expected


def test_the_checker_catches_a_row_that_allows_what_nothing_imports() -> None:
    lying = {**TOY, "provision.hosts": {"provision.core", "provision.adapters"}}
    graph = {**GOOD, "provision.hosts.h": {"provision.core.errors"}}  # hosts no longer uses adapters
    assert violations(graph, lying) == ["provision.hosts's row allows provision.adapters, which it does not import"]


def test_a_docstring_may_import_line_is_read_like_a_readme_cell() -> None:
    assert parse_may_import("core, adapters.") == {"provision.core", "provision.adapters"}
    assert parse_may_import("nothing.") == set() and parse_may_import("everything; nothing imports it") == EVERYTHING


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_runner_imports_subprocess() -> None:
    """Every child goes through the owned process tree: adapters/procs.py and its face, adapters/runner.py."""
    allowed = {PACKAGE / "adapters" / "procs.py", PACKAGE / "adapters" / "runner.py"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "subprocess" or n.startswith("subprocess.") for n in names) and path not in allowed:
                found.append(str(path.relative_to(PACKAGE)))
    assert found == []


def test_the_cli_renders_json_in_one_place() -> None:
    """Handlers return results; `--json` is rendered by cli/output.py, never branched on in a handler."""
    branches = [f"{p.name}:{n}" for p in sorted((PACKAGE / "cli").glob("*.py"))
                for n, line in enumerate(p.read_text().splitlines(), 1) if "args.json" in line]  # fmt: skip
    assert branches == []



PROCS, RUNNER = "provision.adapters.procs", "provision.adapters.runner"


def process_tree_users(graph: dict[str, set[str]]) -> list[str]:
    """Modules other than the runner that import procs (the owned process tree)."""
    return sorted(m for m, deps in graph.items() if PROCS in deps and m != RUNNER)


def test_only_the_runner_reaches_the_process_tree() -> None:
    """procs (start, record, stop) is private to adapters/runner.py: every child is started, streamed
    and stopped through the runner's run/probe/start, so there is one way in and one log of argvs."""
    graph = all_modules()
    assert PROCS in graph.get(RUNNER, set())
    assert process_tree_users(graph) == []


def test_the_process_tree_check_catches_a_second_user() -> None:
    graph = {RUNNER: {PROCS}, "provision.hosts.linux.x": {PROCS, "provision.core"}, PROCS: set()}
    assert process_tree_users(graph) == ["provision.hosts.linux.x"]
