"""RULER's scoring (``scripts/eval/synthetic/constants.py`` and ``evaluate.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from headprobe.core.choice import Choice

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(prediction: str) -> str:
    """Strip, replace every control character with a newline, strip again."""
    return _CONTROL.sub("\n", prediction.strip()).strip()


def _check(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if len(preds) != len(refs):
        raise ValueError(f"{len(preds)} predictions but {len(refs)} reference lists")
    if not preds:
        raise ValueError("no predictions to score")


def string_match_all(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """``100 / N * sum_i |{r in R_i : r.lower() in p_i.lower()}| / |R_i|`` (partial credit), rounded to 2
    decimals."""
    _check(preds, refs)
    total = sum(sum(r.lower() in p.lower() for r in rs) / len(rs) for p, rs in zip(preds, refs, strict=True))
    return round(total / len(preds) * 100, 2)


def string_match_part(preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
    """``100 / N * sum_i max_{r in R_i} [r.lower() in p_i.lower()]`` (any reference counts), rounded to 2
    decimals."""
    _check(preds, refs)
    total = sum(max(r.lower() in p.lower() for r in rs) for p, rs in zip(preds, refs, strict=True))
    return round(total / len(preds) * 100, 2)


class Scorer(Choice, what="RULER metric"):
    """RULER's two metrics, by their RULER names; ``Scorer.MATCH_ALL(preds, refs)`` scores (0-100)."""

    MATCH_ALL = "string_match_all"  # every reference counts (partial credit)
    MATCH_PART = "string_match_part"  # any reference counts

    def __call__(self, preds: Sequence[str], refs: Sequence[Sequence[str]]) -> float:
        return string_match_all(preds, refs) if self is Scorer.MATCH_ALL else string_match_part(preds, refs)
