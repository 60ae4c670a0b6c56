"""English word lists shipped by the ``wonderwords`` package (read from its package data, no download)."""

from __future__ import annotations

import functools
from importlib.resources import files

_FILES = {"nouns": "nounlist.txt", "verbs": "verblist.txt", "adjectives": "adjectivelist.txt"}


@functools.cache
def _read(name: str) -> tuple[str, ...]:
    text = files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _file(kind: str) -> str:
    if kind not in _FILES:
        raise ValueError(f"unknown word kind {kind!r}; choose nouns, verbs or adjectives")
    return _FILES[kind]


@functools.cache
def shipped(kind: str) -> tuple[str, ...]:
    """wonderwords' ``"nouns"``, ``"verbs"`` or ``"adjectives"`` list exactly as shipped, deduplicated and
    sorted (RULER draws its words from these raw lists)."""
    return tuple(sorted(set(_read(_file(kind)))))


@functools.cache
def words(kind: str) -> tuple[str, ...]:
    """Lower-case alphabetic ``"nouns"``, ``"verbs"`` or ``"adjectives"``, profanity removed, sorted."""
    banned = set(_read("profanitylist.txt"))
    clean = {w.lower() for w in _read(_file(kind)) if w.isalpha() and w.isascii()}
    return tuple(sorted(clean - banned))
