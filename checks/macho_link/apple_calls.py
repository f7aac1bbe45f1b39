"""Every function a tree calls under `__APPLE__` must be defined in that tree, by libSystem, or by
Vulkan: a source reading of what the linker would say, cheap enough for every test run.

Regions are the true branches of `#if`/`#ifdef`/`#elif` lines naming `__APPLE__` without negation.
A call is an identifier followed by `(` that is not a keyword and not reached through `->` or `.`
(function pointers resolve at run time). Defined: a function definition (`name(...) {`) or macro in
the tree; libSystem: the symbols of zig's libSystem.tbd (Apple's link stub) and the macros of its
darwin headers; Vulkan: `vk*` entry points; compiler builtins."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

KEYWORDS = frozenset(
    [
        "if",
        "while",
        "for",
        "switch",
        "return",
        "sizeof",
        "defined",
        "do",
        "else",
        "case",
        "goto",
        "typeof",
        "_Alignof",
        "alignof",
        "_Static_assert",
        "static_assert",
        "__attribute__",
        "__typeof__",
        "__asm__",
        "asm",
        "offsetof",
        "va_arg",
        "va_start",
        "va_end",
        "__has_include",
        "__has_builtin",
        "__has_attribute",
        "__has_feature",
        "_Generic",
        "void",
        "int",
        "char",
        "short",
        "long",
        "unsigned",
        "signed",
        "float",
        "double",
        "bool",
        "_Bool",
        "const",
        "volatile",
        "struct",
        "union",
        "enum",
    ]
)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
CALL = re.compile(r"(?<![\w.>])(?<!->)\b([A-Za-z_]\w*)\s*\(")
DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)
DEFINITION = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?\{", re.S)
TBD_SYMBOL = re.compile(r"\b_(\w+)")


@dataclass(frozen=True)
class Call:
    file: str
    line: int
    name: str


def strip(text: str) -> str:
    """Comments and string literals blanked, line numbers kept."""
    keep_lines = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return STRING.sub(keep_lines, COMMENT.sub(keep_lines, text))


def apple_regions(text: str) -> list[tuple[int, int]]:
    """(start, end) line spans (1-based, inclusive) of code compiled only for __APPLE__."""
    regions: list[tuple[int, int]] = []
    stack: list[int | None] = []  # per open #if: the line its __APPLE__ branch began, else None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)", line)
        if not m:
            continue
        kind, rest = m.group(1), m.group(2)
        apple = "__APPLE__" in rest and "!" not in rest and kind in ("if", "ifdef", "elif")
        if kind in ("if", "ifdef", "ifndef"):
            stack.append(number if apple else None)
            continue
        if not stack:
            continue
        began = stack[-1]
        if began is not None:
            regions.append((began + 1, number - 1))
        if kind == "endif":
            stack.pop()
        else:
            stack[-1] = number if kind == "elif" and apple else None
    return regions


def tree_definitions(texts: dict[str, str]) -> set[str]:
    names: set[str] = set()
    for text in texts.values():
        names |= set(DEFINE.findall(text)) | set(DEFINITION.findall(text))
    return names - KEYWORDS


def system_names(zig_lib: Path) -> set[str]:
    tbd = zig_lib / "libc" / "darwin" / "libSystem.tbd"
    names = set(TBD_SYMBOL.findall(tbd.read_text(errors="replace")))
    for header in (zig_lib / "libc" / "include" / "any-darwin-any").rglob("*.h"):
        names |= set(DEFINE.findall(header.read_text(errors="replace")))
    for header in (zig_lib / "include").glob("*.h"):  # clang's own headers (intrinsics, stdatomic)
        names |= set(DEFINE.findall(header.read_text(errors="replace")))
    return names


def zig_lib_dir() -> Path:
    import ziglang  # the wheel of the `test` extra

    return Path(ziglang.__file__).parent / "lib"


def apple_calls(tree: Path) -> list[Call]:
    texts = {
        str(p.relative_to(tree)): strip(p.read_text(errors="replace"))
        for p in sorted(tree.rglob("*"))
        if p.suffix in (".c", ".h") and p.is_file()
    }
    calls = []
    for rel, text in texts.items():
        lines = text.splitlines()
        for start, end in apple_regions(text):
            for offset, line in enumerate(lines[start - 1 : end]):
                if re.match(r"\s*#", line):
                    continue
                calls += [Call(rel, start + offset, n) for n in CALL.findall(line) if n not in KEYWORDS]
    return calls


def header_macros(dirs: list[Path]) -> set[str]:
    """Macros of the headers of what the tree links (epoxy's gl* names are macros of epoxy_gl*)."""
    names: set[str] = set()
    for folder in dirs:
        for header in folder.rglob("*.h"):
            names |= set(DEFINE.findall(header.read_text(errors="replace")))
    return names


def undefined_apple_calls(tree: Path, dep_headers: list[Path], zig_lib: Path | None = None) -> list[Call]:
    texts = {
        str(p.relative_to(tree)): strip(p.read_text(errors="replace"))
        for p in tree.rglob("*")
        if p.suffix in (".c", ".h") and p.is_file()
    }
    known = tree_definitions(texts) | system_names(zig_lib or zig_lib_dir()) | header_macros(dep_headers)
    out = []
    for c in apple_calls(tree):
        if c.name in known or c.name.startswith(("vk", "__builtin_", "__atomic_", "__sync_", "__c11_")):
            continue
        if re.search(rf"\b{c.name}\s*=[^=]", texts[c.file]):
            continue  # a function pointer variable (a dlsym result), resolved at run time
        out.append(c)
    return out


if __name__ == "__main__":
    for call in undefined_apple_calls(Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]]):
        print(f"{call.file}:{call.line}: {call.name}")
