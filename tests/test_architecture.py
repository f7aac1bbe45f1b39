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


def argparse_users(sources: dict[str, str]) -> list[str]:
    """Modules outside the CLI that import argparse: a command line hidden inside the package."""
    found = []
    for rel, source in sources.items():
        if rel.startswith("cli/"):
            continue
        for node in ast.walk(ast.parse(source)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if "argparse" in names:
                found.append(rel)
    return sorted(set(found))


def test_every_command_line_is_a_provision_command_or_a_checks_script() -> None:
    """A `python -m provision.x.y` with its own parser is a command nobody finds: commands live in
    provision/cli/, end-to-end tools in checks/ (checks/apir-loopback/run-ops, checks/macos-report)."""
    sources = {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
    assert argparse_users(sources) == []


def test_the_argparse_check_sees_an_import_and_not_a_mention() -> None:
    sources = {"cli/run.py": "import argparse\n", "hosts/linux/x.py": "import argparse\n",
               "apir/y.py": "from argparse import ArgumentParser\n", "serve/z.py": "# argparse would take it\n"}
    assert argparse_users(sources) == ["apir/y.py", "hosts/linux/x.py"]

def test_the_cli_renders_json_in_one_place() -> None:
    """Handlers return results; `--json` is rendered by cli/output.py, never branched on in a handler."""
    branches = [f"{p.name}:{n}" for p in sorted((PACKAGE / "cli").glob("*.py"))
                for n, line in enumerate(p.read_text().splitlines(), 1) if "args.json" in line]  # fmt: skip
    assert branches == []


FACES = ("provision.cli", "provision.api", "provision.routes")
HOST_PACKAGES = ("provision.hosts.linux", "provision.hosts.darwin")


def host_bypasses(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a host package from the CLI, the API or the route choice: they reach a host
    through the registry (``hosts.native()``/``hosts.get()``) alone."""
    return sorted(f"{mod} imports {dep}" for mod, deps in graph.items()
                  if mod.startswith(FACES) for dep in deps if dep.startswith(HOST_PACKAGES))  # fmt: skip


def test_the_cli_api_and_routes_reach_a_host_only_through_the_registry() -> None:
    assert host_bypasses(all_modules()) == []
    table = readme_table()
    for face in FACES:  # and the README does not allow it either
        allowed = table[face]
        assert isinstance(allowed, set) and not {p for p in allowed if p.startswith(HOST_PACKAGES)}, face


def test_the_bypass_check_catches_a_face_importing_a_host() -> None:
    graph = {"provision.cli.x": {"provision.hosts.linux.run.execute"}, "provision.api.jobs": {"provision.hosts"},
             "provision.routes.y": {"provision.hosts.darwin"}}  # fmt: skip
    assert host_bypasses(graph) == ["provision.cli.x imports provision.hosts.linux.run.execute",
                                    "provision.routes.y imports provision.hosts.darwin"]  # fmt: skip


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


# --- one application context: one renderer, no environment written, settings handed down ----------

RENDERER = PACKAGE / "cli" / "output.py"


def prints_in(source: str) -> list[int]:
    """Lines that print past the logger: ``print(...)`` or a write straight to ``sys.stdout``/``sys.stderr``."""
    def std_write(f: ast.expr) -> bool:
        return (isinstance(f, ast.Attribute) and f.attr == "write" and isinstance(f.value, ast.Attribute)
                and f.value.attr in ("stdout", "stderr") and isinstance(f.value.value, ast.Name)
                and f.value.value.id == "sys")  # fmt: skip

    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    is_print = [n for n in calls if isinstance(n.func, ast.Name) and n.func.id == "print"]
    return sorted(n.lineno for n in calls if n in is_print or std_write(n.func))


def test_nothing_under_the_cli_prints_but_the_renderer() -> None:
    """Progress and warnings go to the logger, so -q hides them and the log file keeps them; results,
    errors and an interactive command's questions go through cli/output.py."""
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted((PACKAGE / "cli").rglob("*.py")) if p != RENDERER
             for n in prints_in(p.read_text())]  # fmt: skip
    assert found == []


def test_the_print_check_sees_a_print_and_a_stderr_write() -> None:
    src = "import sys\nprint('x', file=sys.stderr)\nsys.stderr.write('y')\nout.write('z')\n"
    assert prints_in(src) == [2, 3]


_ENVIRON_WRITERS = {"update", "pop", "setdefault", "clear", "popitem", "__setitem__", "__delitem__"}


def environ_writes(source: str) -> list[int]:
    """Lines that change this process's environment: ``os.environ[k] = v``, ``del os.environ[k]``,
    ``os.environ.update/pop/setdefault/…``, ``os.putenv``/``os.unsetenv``."""

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
                and node.value.id == "os")  # fmt: skip

    found = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        if any(isinstance(t, ast.Subscript) and is_environ(t.value) for t in targets):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if (f.attr in _ENVIRON_WRITERS and is_environ(f.value)) or (
                    f.attr in ("putenv", "unsetenv") and isinstance(f.value, ast.Name) and f.value.id == "os"):
                found.append(node.lineno)
    return sorted(found)


def test_no_module_writes_os_environ() -> None:
    """main hands the settings down and the runner gives each child its environment
    (runner.child_env: the command's file and --set values as PROVISION_*); nothing writes
    os.environ, main included, so one command's settings cannot leak into the next."""
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             for n in environ_writes(p.read_text())]  # fmt: skip
    assert found == []


def test_the_environ_check_sees_each_way_of_writing_it() -> None:
    src = ("import os\nos.environ['A'] = '1'\nos.environ.update(B='2')\ndel os.environ['A']\n"
           "os.putenv('C', '3')\nx = os.environ.get('D')\nenv = dict(os.environ)\nenv['E'] = '5'\n")  # fmt: skip
    assert environ_writes(src) == [2, 3, 4, 5]


def current_calls_off_the_edge(source: str, in_cli: bool) -> list[int]:
    """Calls of ``current()`` that are not at the program's edge.

    The edge, precisely: (1) ``provision/cli/`` builds the settings once (``settings.load`` in
    main), installs them and hands them to handlers as ``args.app.settings``; no module there
    calls ``current()``. (2) Below the CLI, ``current()`` appears only as the fallback of a
    function whose caller can hand it the settings: ``param or <…>.current()``, ``param`` being a
    parameter of that same function. So every setting can be given from above, and only a caller
    with none to give (a library caller, a test, a thread of the API) falls back to what main
    installed. core/settings.py itself defines current() and is not read here."""
    tree = ast.parse(source)
    ok: set[int] = set()  # id() of the current() calls that are the fallback of a parameter

    def is_current(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "current")
            or (isinstance(node.func, ast.Name) and node.func.id == "current"))

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        for node in ast.walk(fn):
            if (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and len(node.values) == 2
                    and isinstance(node.values[0], ast.Name) and node.values[0].id in params
                    and is_current(node.values[1])):  # fmt: skip
                ok.add(id(node.values[1]))
    return sorted(node.lineno for node in ast.walk(tree) if is_current(node) and (in_cli or id(node) not in ok))


def test_settings_current_is_read_only_at_the_edge() -> None:
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if p == PACKAGE / "core" / "settings.py":
            continue
        in_cli = p.is_relative_to(PACKAGE / "cli")
        found += [f"{p.relative_to(PACKAGE)}:{n}" for n in current_calls_off_the_edge(p.read_text(), in_cli)]
    assert found == []


def test_the_edge_check_tells_a_fallback_from_a_lookup() -> None:
    src = ("def given(x, settings=None):\n    return (settings or s.current()).typed.accel\n"
           "def looked_up(x):\n    return s.current().typed.accel\n"
           "def not_a_param(x):\n    return (other or s.current()).typed.accel\n")  # fmt: skip
    assert current_calls_off_the_edge(src, in_cli=False) == [4, 6]
    assert current_calls_off_the_edge(src, in_cli=True) == [2, 4, 6]
