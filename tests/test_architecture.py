"""The rooms hold: imports point down (cli -> domain/hosts -> adapters -> core), no cycles, small modules.

Read from the source with ast (function-level imports included), so a lazy import cannot hide a
wrong direction.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "provision"
MAX_LINES = 400

# layer -> layers it must never import (prefixes of dotted module names)
FORBIDDEN = {
    "provision.core": ("provision.adapters", "provision.hosts", "provision.cli", "provision.models",
                       "provision.images", "provision.apir", "provision.doctor", "provision.bench",
                       "provision.api", "provision.serve", "provision.routes", "provision.chat"),
    "provision.adapters": ("provision.hosts", "provision.cli", "provision.models", "provision.images",
                           "provision.apir", "provision.doctor", "provision.bench", "provision.api",
                           "provision.serve", "provision.routes", "provision.chat"),
    "provision.hosts.linux": ("provision.hosts.darwin", "provision.cli"),
    "provision.hosts.darwin": ("provision.hosts.linux", "provision.cli"),
    "provision.models": ("provision.hosts", "provision.cli", "provision.images", "provision.apir"),
    "provision.images": ("provision.hosts", "provision.cli"),
    "provision.apir": ("provision.cli",),
    "provision.doctor": ("provision.cli",),
    "provision.bench": ("provision.cli", "provision.hosts", "provision.adapters"),
    "provision.routes": ("provision.cli", "provision.serve", "provision.chat", "provision.doctor"),
    # the choice itself is pure: facts in, decision out (the probes live in routes.probe)
    "provision.routes.choose": ("provision.adapters", "provision.hosts", "provision.apir", "provision.routes.probe"),
    "provision.chat": ("provision.cli", "provision.hosts", "provision.serve", "provision.routes"),
}


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


def violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in graph.items():
        for layer, banned in FORBIDDEN.items():
            if mod == layer or mod.startswith(layer + "."):
                out += [f"{mod} imports {d}" for d in deps for b in banned if d == b or d.startswith(b + ".")]
        if not mod.startswith("provision.cli") and mod != "provision.__main__":
            out += [f"{mod} imports the CLI ({d})" for d in deps if d.startswith("provision.cli")]
    return sorted(set(out))


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


def test_imports_point_down() -> None:
    assert violations(all_modules()) == []


def test_no_import_cycles() -> None:
    # A package's __init__ importing its own modules is not a cycle of concerns; all others are.
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in all_modules().items()}
    assert cycles(graph) == []


def test_no_module_over_the_size_limit() -> None:
    big = {module_name(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_every_package_says_what_lives_there_and_what_it_may_import() -> None:
    missing = []
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent != PACKAGE and "import" not in doc.lower():
            missing.append(module_name(init))
    assert missing == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("provision.core.x", "from provision.adapters import podman\n",
         ["provision.core.x imports provision.adapters.podman"]),
        ("provision.adapters.x", "def f():\n    from provision.hosts.linux import backend\n",
         ["provision.adapters.x imports provision.hosts.linux.backend"]),
        ("provision.models.x", "from provision.cli import main\n",
         ["provision.models.x imports provision.cli", "provision.models.x imports the CLI (provision.cli)"]),
        ("provision.hosts.linux.x", "from provision.core import errors\n", []),
    ],
)
def test_the_checker_catches_a_wrong_direction(tmp_path: Path, module: str, source: str, expected: list[str]) -> None:
    # The checker itself must be able to fail: feed it a module with a forbidden import.
    path = tmp_path / "x.py"
    path.write_text(source)
    tree = ast.parse(source)
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            deps.add(f"{node.module}.{node.names[0].name}" if _is_module(f"{node.module}.{node.names[0].name}")
                     else node.module)
    assert violations({module: deps}) == expected


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
