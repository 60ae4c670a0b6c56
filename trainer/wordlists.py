"""English word lists shipped by the ``wonderwords`` package (read from its package data, no download)."""

from __future__ import annotations

import functools
from importlib.resources import files


@functools.cache
def _read(name: str) -> tuple[str, ...]:
    text = files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


@functools.cache
def words(kind: str) -> tuple[str, ...]:
    """Lower-case alphabetic ``"nouns"``, ``"verbs"`` or ``"adjectives"``, profanity removed, sorted."""
    fname = {"nouns": "nounlist.txt", "verbs": "verblist.txt", "adjectives": "adjectivelist.txt"}.get(kind)
    if fname is None:
        raise ValueError(f"unknown word kind {kind!r}; choose nouns, verbs or adjectives")
    banned = set(_read("profanitylist.txt"))
    clean = {w.lower() for w in _read(fname) if w.isalpha() and w.isascii()}
    return tuple(sorted(clean - banned))
