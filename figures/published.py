"""The study's published numbers (``reference_values.json``), looked up by quantity and member."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

PATH = Path(__file__).with_name("reference_values.json")


@cache
def _values() -> dict:
    return json.loads(PATH.read_text())


def lookup(quantity: str) -> dict[str, float]:
    """``{member or 'a - b': value}`` of one published quantity (``ruler_overall``, ``ruler_gain``,
    ``retrieval_head_fraction``)."""
    return dict(_values()[quantity]["values"])


def source(quantity: str) -> str:
    return _values()[quantity]["source"]
