""""Did you mean": the known names closest to a mistyped one (stacks, models, commands).

difflib's ratio, not an edit distance: `tiny-lama` finds `tiny-llama`, `llama-lnux` finds
`llama-linux`, and a word like nothing known suggests nothing (no guess is better than a wrong one).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CUTOFF = 0.6  # below this, difflib's matches are noise for names this short


def closest(word: str, known: Iterable[str], *, n: int = 3) -> list[str]:
    """Up to ``n`` names of ``known`` near ``word``, nearest first; when none is near by spelling, the
    names that contain the word or that it contains (``qwen`` for ``qwen2.5:0.5b``)."""
    names = sorted(set(known))
    near = difflib.get_close_matches(word, names, n=n, cutoff=CUTOFF)
    if near:
        return near
    lower = word.lower()
    return [m for m in names if len(lower) >= 3 and (lower in m.lower() or m.lower() in lower)][:n]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """"did you mean A (or B)?" for the fix line, or "" when nothing is near."""
    near = closest(word, known)
    if not near:
        return ""
    return "did you mean " + " or ".join(f"{n!r}" for n in near) + "?"
