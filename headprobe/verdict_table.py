"""The study's verdict table, ``study_verdicts``: its columns and how it reads as text.

One row per finding of the study (:mod:`headprobe.study.verdicts` computes it from a study's tables); here
only what every reader shares, below the layers that compute or show it: ``headprobe show``, the study's
``report.md`` and its command line, and the verdict figure.
"""

from __future__ import annotations

import pandas as pd

from headprobe.results import Column, Schema

VERDICTS = Schema(
    "study_verdicts",
    (
        Column("finding", "int", "the study's finding, 1-8 (docs/study.md, Verdicts)"),
        Column("title", "str", "the finding in a few words"),
        Column("statistic", "str", "what the value is, with the members, run and distance it was taken at"),
        Column("unit", "str", "points (0-100), Spearman rho, fraction of heads, normalised entropy, ..."),
        Column("value", "float", "our value of the statistic (seed means per member); missing when unmeasured"),
        Column("ci_low", "float", "95% bootstrap interval over seeds, low end; missing with one seed"),
        Column("ci_high", "float", "its high end"),
        Column("published", "float", "the study's own value, where it gives one; else missing"),
        Column("published_scale", "str", "the study's scale the published value is from (0.6b, 3b); else empty"),
        Column("published_note", "str", "what the published value measures, at which scale, or why there is none"),
        Column("verdict", "str", "holds, opposite or inconclusive"),
        Column("reason", "str", "why: the interval against the rule, or what is missing"),
        Column("inputs", "str", "the tables and columns the statistic was computed from"),
        Column("members", "str", "the members compared, comma-separated"),
        Column("seeds", "int", "seeds of the compared member with the fewest (0 when none)"),
    ),
)


DIGITS = {"points": 1, "Spearman rho": 2, "fraction of heads": 3, "normalised entropy": 3, "reordering": 3}
DIGITS_DEFAULT = 2  # decimals of a verdict's statistic, by its unit (headprobe.study.verdicts)


def _number(value: float, digits: int, sign: bool = False) -> str:
    return "n/a" if pd.isna(value) else f"{value:{'+' if sign else ''}.{digits}f}"


def verdict_cells(frame: pd.DataFrame, bold: bool = False) -> pd.DataFrame:
    """A ``study_verdicts`` table as text cells, a row per finding: our value with its interval, the published
    value with what it measures, the verdict (``**bold**`` for Markdown) and its reason."""
    cells = []
    for r in frame.itertuples(index=False):
        digits = DIGITS.get(r.unit, DIGITS_DEFAULT)
        ours = _number(r.value, digits, sign=True)
        if not pd.isna(r.ci_low):
            ours += f" [{_number(r.ci_low, digits)}, {_number(r.ci_high, digits)}]"
        published = r.published_note if pd.isna(r.published) else f"{r.published:+g} ({r.published_note})"
        cells.append({"#": r.finding, "finding": r.title, "statistic": f"{r.statistic} ({r.unit})",
                      "ours [95% interval]": ours, "published": published,
                      "verdict": f"**{r.verdict}**" if bold else r.verdict, "reason": r.reason})  # fmt: skip
    return pd.DataFrame(cells)
