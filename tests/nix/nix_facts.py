"""Reading nix/facts/upstream.json (written by checks/upstream-facts from the pinned upstream trees)
and deciding, from those facts alone, what a build of ours would do: which meson dependency() calls
our -D flags switch on, which `mv` steps of libkrun's Makefile run, what our patches add."""

from __future__ import annotations

import ast
import hashlib
import json
import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FACTS = REPO / "nix" / "facts" / "upstream.json"


@cache
def facts() -> dict[str, Any]:
    return json.loads(FACTS.read_text())


class Unknown(Exception):
    """A meson expression the facts cannot decide (a compiler probe, a found() check, …)."""


# --- meson -----------------------------------------------------------------------------------


def parse_meson_flags(flags: list[str]) -> dict[str, str]:
    parsed = {}
    for flag in flags:
        m = re.fullmatch(r"-D([\w-]+)=(.*)", flag)
        assert m, f"not a meson -D flag: {flag}"
        parsed[m.group(1)] = m.group(2)
    return parsed


def option_value(option: dict[str, Any], text: str) -> Any:
    """The value meson would take for `-Dname=text`, or AssertionError naming why it is invalid."""
    kind, name = option["type"], option["name"]
    if kind == "boolean":
        assert text in ("true", "false"), f"-D{name}={text}: boolean option wants true or false"
        return text == "true"
    if kind == "feature":
        assert text in ("enabled", "disabled", "auto"), f"-D{name}={text}: feature wants enabled/disabled/auto"
        return text
    if kind == "combo":
        assert text in option["choices"], f"-D{name}={text}: not one of {option['choices']}"
        return text
    if kind == "array":
        values = [v for v in text.split(",") if v]
        bad = [v for v in values if "choices" in option and v not in option["choices"]]
        assert not bad, f"-D{name}={text}: {bad} not among {option['choices']}"
        return values
    return text


class MesonEnv:
    """Options (defaults, then our -D values), the host OS, and the `with_x = …` variables."""

    def __init__(self, tree: dict[str, Any], flags: list[str], host: str) -> None:
        self.options = {o["name"]: o for o in tree["options"]}
        self.values = {name: o["default"] for name, o in self.options.items()}
        for name, text in parse_meson_flags(flags).items():
            assert name in self.options, f"-D{name}: {tree['source']} @{tree['read_rev'][:8]} has no such option"
            self.values[name] = option_value(self.options[name], text)
        self.host = host
        self.variables: dict[str, Any] = {}
        self.exprs: dict[str, str] = {}
        for assign in tree["meson"]["meson.build"]["assignments"]:
            if assign["conditions"]:
                continue
            self.exprs[assign["name"]] = assign["expr"]
            try:
                self.variables[assign["name"]] = self.eval(assign["expr"])
            except Unknown:
                self.variables.pop(assign["name"], None)

    def eval(self, expr: str) -> Any:
        try:
            node = ast.parse(expr.strip(), mode="eval").body
        except SyntaxError as err:
            raise Unknown(expr) from err
        return self._eval(node)

    def _eval(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List):
            return [self._eval(e) for e in node.elts]
        if isinstance(node, ast.Name):
            if node.id in ("true", "false"):
                return node.id == "true"
            if node.id in self.variables:
                return self.variables[node.id]
            raise Unknown(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self._eval(node.operand)
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            for value in node.values:
                if bool(self._eval(value)) != is_and:
                    return not is_and
            return is_and
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self._eval(node.left), self._eval(node.comparators[0])
            op = node.ops[0]
            if isinstance(op, ast.Eq):
                return left == right
            if isinstance(op, ast.NotEq):
                return left != right
            if isinstance(op, ast.In):
                return left in right
            if isinstance(op, ast.NotIn):
                return left not in right
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "get_option" and isinstance(node.args[0], ast.Constant):
                name = node.args[0].value
                if name in self.values:
                    return self.values[name]
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "system"
                and getattr(func.value, "id", "") == "host_machine"
            ):
                return self.host
            if isinstance(func, ast.Attribute) and func.attr in ("enabled", "disabled", "auto"):
                value = self._eval(func.value)  # a feature option's value
                if value in ("enabled", "disabled", "auto"):
                    return value == func.attr
        raise Unknown(ast.unparse(node))

    def mentions(self, expr: str, options: set[str], depth: int = 0) -> bool:
        """Whether expr reads one of `options`, directly or through a `with_x = …` variable."""
        if any(f"get_option('{o}')" in expr for o in options):
            return True
        return depth < 3 and any(
            re.search(rf"\b{re.escape(name)}\b", expr) and self.mentions(text, options, depth + 1)
            for name, text in self.exprs.items()
        )


def switched_on(tree: dict[str, Any], flags: list[str], host: str) -> tuple[list[dict[str, Any]], list[str]]:
    """dependency() calls that a configure with `flags` on `host` makes required, and the calls whose
    conditions read one of our flags but that the facts cannot decide (those must not exist)."""
    env = MesonEnv(tree, flags, host)
    ours = set(parse_meson_flags(flags))
    on, undecided = [], []
    for dep in tree["meson"]["meson.build"]["dependencies"]:
        if not dep["name"]:
            continue
        exprs = [c["expr"] for c in dep["conditions"]] + ([dep["required"]] if dep["required"] else [])
        try:
            active = all(bool(env.eval(c["expr"])) != c["negate"] for c in dep["conditions"])
            required = active and (dep["required"] is None or bool(env.eval(dep["required"])))
        except Unknown:
            if any(env.mentions(e, ours) for e in exprs):
                undecided.append(f"{dep['name']} ({dep['file']}:{dep['line']})")
            continue
        if required:
            on.append(dep)
    return on, undecided


# --- patches ---------------------------------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def applied_patch_facts(tree_name: str, patch_names: list[str]) -> dict[str, Any]:
    """The facts of the patches a derivation applies (by file name), checked against the patch files
    as they are now: every one applies to the pinned tree and is the one the facts were made from."""
    recorded = facts()["patches"][tree_name]
    by_name = {Path(p["patch"]).name: p for p in recorded["patches"]}
    for name in patch_names:
        assert name in by_name, f"{tree_name}: {name} is applied but checks/upstream-facts never checked it"
        entry = by_name[name]
        assert entry["applies"], f"{entry['patch']} does not apply to {tree_name} @{entry['rev'][:8]}"
        assert entry["sha256"] == sha256(REPO / entry["patch"]), (
            f"{entry['patch']} changed: rerun checks/upstream-facts"
        )
    return recorded


def store_basename(path: str) -> str:
    """/nix/store/<hash>-name.patch -> name.patch"""
    return Path(path).name.split("-", 1)[1]


# --- make / shell ----------------------------------------------------------------------------


def replace_rules(post_patch: str, file: str) -> list[tuple[str, str]]:
    """The (from, to) pairs of every `substituteInPlace FILE --replace-fail FROM TO` in a script."""
    rules = []
    for line in post_patch.replace("\\\n", " ").splitlines():  # join continued lines
        words = shlex.split(line) if "substituteInPlace" in line else []
        if words[:2] != ["substituteInPlace", file]:
            continue
        for i, word in enumerate(words):
            if word == "--replace-fail":
                rules.append((words[i + 1], words[i + 2]))
    return rules


def make_conditions_hold(conditions: list[dict[str, Any]], variables: dict[str, str]) -> bool:
    held = True
    for c in conditions:
        m = re.fullmatch(r"\((.*),(.*)\)", c["args"])
        assert m, f"unreadable make conditional {c}"
        left, right = (expand(x.strip(), variables) for x in m.groups())
        equal = left == right
        held = held and (equal != c["negate"]) == (c["test"] == "ifeq")
    return held


def expand(text: str, variables: dict[str, str]) -> str:
    """Expand $(NAME) and $(NAME_$(OTHER)) the way make would, from `variables`."""
    for _ in range(5):
        new = re.sub(r"\$\(([A-Za-z_]+)\)", lambda m: variables.get(m.group(1), ""), text)
        if new == text:
            break
        text = new
    return text
