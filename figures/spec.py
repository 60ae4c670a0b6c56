"""What a figure module declares: its name, title, inputs, how to read it, and its ``build``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from figures.data import Results


@dataclass(frozen=True)
class Spec:
    """One figure or table of the study.

    Attributes:
        name: the file stem and the ``--only`` name.
        title: a one-line title.
        kind: ``figure`` (``build`` returns a matplotlib Figure) or ``table`` (a :class:`figures.tables.Table`).
        inputs: the result tables it reads.
        how_to_read: one line for docs/figures.md and the report.
        build: ``build(results) -> Figure | Table``; raises :class:`figures.data.MissingInput` when its
            inputs are absent.
        family: ``study`` (drawn from a study's folder: its members, seeds and runs) or ``model`` (drawn
            from any model's own results, a panel or colour per model). A folder holding no results of a
            spec's family is not that spec's kind of folder: the spec is left out, not reported as skipped
            (:meth:`figures.data.Results.absent`).
    """

    name: str
    title: str
    kind: str
    inputs: tuple[str, ...]
    how_to_read: str
    build: Callable[[Results], Any]
    family: str = "study"
