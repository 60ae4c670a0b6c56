"""What each metric contributes to a run's summary: aggregate rows from its table, and a one-line headline.

A summary row is ``(length, layer_type, layer, statistic, value)``; ``layer_type`` is ``all`` for
aggregates over every head, ``layer`` is set only for per-layer statistics (effective rank). The
analysis job adds the model and metric names (``analysis_summary``, :mod:`headprobe.analysis.summary`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pandas as pd

from headprobe.metrics.retrieval import READING_MASS, retrieval_heads

SummaryRow = tuple[int, str, int | None, str, float]
RETRIEVAL_THRESHOLD = 0.1  # a retrieval head scores at least this (Wu et al.)


def _by_type(part: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    yield "all", part
    yield from part.groupby("layer_type")


def mean_rows(frame: pd.DataFrame) -> Iterator[SummaryRow]:
    """Per length and layer type (and ``all``): the mean ``value`` (and ``norm_value`` when present)."""
    for length, part in frame.groupby("length"):
        for kind, group in _by_type(part):
            yield int(length), kind, None, "mean", float(group["value"].mean())
            if "norm_value" in group:
                yield int(length), kind, None, "norm_mean", float(group["norm_value"].mean())


def retrieval_rows(frame: pd.DataFrame) -> Iterator[SummaryRow]:
    """Per length: samples kept and decoded, the mean score, and retrieval heads per layer type; and per
    layer type the teacher-forced retrieval heads (``forced_value`` >= the threshold, every sample counted),
    their fraction, the mean forced mass over the heads, and the needle-reading heads (``forced_mass`` >=
    :data:`~headprobe.metrics.retrieval.READING_MASS`) and their fraction."""
    for length, part in frame.groupby("length"):
        n = int(length)
        yield n, "all", None, "n_kept", float(part["n_kept"].iloc[0])
        yield n, "all", None, "n_samples", float(part["n_samples"].iloc[0])
        yield n, "all", None, "mean_score", math.nan if part["value"].isna().all() else float(part["value"].mean())
        for r in retrieval_heads(part, RETRIEVAL_THRESHOLD).itertuples():
            yield n, r.layer_type, None, "retrieval_heads", float(r.retrieval_heads)
            yield n, r.layer_type, None, "heads", float(r.heads)
            yield n, r.layer_type, None, "fraction", float(r.fraction)
        if "forced_value" not in part:  # a table of revision 5 or earlier
            continue
        mass = dict(_by_type(part))
        for r in retrieval_heads(part, RETRIEVAL_THRESHOLD, score="forced_value").itertuples():
            yield n, r.layer_type, None, "forced_retrieval_heads", float(r.retrieval_heads)
            yield n, r.layer_type, None, "forced_fraction", float(r.fraction)
            yield n, r.layer_type, None, "forced_mass", float(mass[r.layer_type]["forced_mass"].mean())
        for r in retrieval_heads(part, READING_MASS, score="forced_mass").itertuples():
            yield n, r.layer_type, None, "reading_heads", float(r.retrieval_heads)
            yield n, r.layer_type, None, "reading_fraction", float(r.fraction)


def erank_rows(frame: pd.DataFrame) -> Iterator[SummaryRow]:
    """Per length and residual site: the effective rank (uncentred, Roy & Vetterli's) and the centred one."""
    for r in frame.itertuples():
        yield int(r.length), r.layer_type, int(r.layer), "erank", float(r.value)
        yield int(r.length), r.layer_type, int(r.layer), "erank_centered", float(r.centered)


def mean_headline(part: pd.DataFrame) -> str:
    """``part``: one metric's summary rows at one length."""
    stats = part[part.statistic == "mean"].set_index("layer_type")["value"]
    by_type = ", ".join(f"{t} {v:.3f}" for t, v in stats.items() if t != "all")
    return f"mean {stats['all']:.3f} ({by_type})"


def retrieval_headline(part: pd.DataFrame) -> str:
    overall = part[part.layer_type == "all"].set_index("statistic")["value"]
    line = (
        f"{int(overall['n_kept'])}/{int(overall['n_samples'])} samples kept, "
        f"{int(overall['retrieval_heads'])} retrieval heads ({overall['fraction']:.1%})"
    )
    if "forced_retrieval_heads" not in overall:
        return line
    return (
        f"{line}; teacher-forced {int(overall['forced_retrieval_heads'])} ({overall['forced_fraction']:.1%}), "
        f"forced mass {overall['forced_mass']:.3f}"
        + (f", {int(overall['reading_heads'])} needle-reading" if "reading_heads" in overall else "")
    )


def erank_headline(part: pd.DataFrame) -> str:
    values = part[part.statistic == "erank"].sort_values("layer")["value"].tolist()
    return f"effective rank {values[0]:.1f} (embedding) -> {values[-1]:.1f} (last block)"
