"""``analysis_summary``: the aggregates of one model's analysis tables, as a derived tidy table.

One row per model x metric x length x layer type (x layer, for effective rank) x statistic:

=============  =========================================================================================
metric         statistics
=============  =========================================================================================
entropy        ``mean`` (nats) and ``norm_mean`` over heads and samples, per layer type and ``all``
reordering     ``mean`` per layer type and ``all``
retrieval      ``retrieval_heads`` (score >= threshold), ``heads``, ``fraction`` per layer type and ``all``;
               ``n_kept``, ``n_samples``, ``mean_score`` (``all``)
erank          ``erank`` and ``erank_uncentered`` per layer (``layer_type`` of that layer)
=============  =========================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import pandas as pd

from headprobe.metrics import retrieval_heads
from headprobe.results import Column, Schema

ANALYSIS_SUMMARY = Schema(
    "analysis_summary",
    (
        Column("model", "str"),
        Column("metric", "str"),
        Column("length", "int"),
        Column("layer_type", "str", "sliding, full, embedding or all"),
        Column("layer", "int", "the layer of per-layer statistics (erank), else missing"),
        Column("statistic", "str"),
        Column("value", "float"),
    ),
)

Row = tuple[str, int, str, int | None, str, float]


def _by_type(part: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    yield "all", part
    yield from part.groupby("layer_type")


def _means(metric: str, frame: pd.DataFrame) -> Iterator[Row]:
    for length, part in frame.groupby("length"):
        for kind, group in _by_type(part):
            yield metric, int(length), kind, None, "mean", float(group["value"].mean())
            if "norm_value" in group:
                yield metric, int(length), kind, None, "norm_mean", float(group["norm_value"].mean())


def _retrieval(frame: pd.DataFrame, threshold: float) -> Iterator[Row]:
    for length, part in frame.groupby("length"):
        n = int(length)
        yield "retrieval", n, "all", None, "n_kept", float(part["n_kept"].iloc[0])
        yield "retrieval", n, "all", None, "n_samples", float(part["n_samples"].iloc[0])
        mean = math.nan if part["value"].isna().all() else float(part["value"].mean())
        yield "retrieval", n, "all", None, "mean_score", mean
        for r in retrieval_heads(part, threshold).itertuples():
            yield "retrieval", n, r.layer_type, None, "retrieval_heads", float(r.retrieval_heads)
            yield "retrieval", n, r.layer_type, None, "heads", float(r.heads)
            yield "retrieval", n, r.layer_type, None, "fraction", float(r.fraction)


def _erank(frame: pd.DataFrame) -> Iterator[Row]:
    for r in frame.itertuples():
        yield "erank", int(r.length), r.layer_type, int(r.layer), "erank", float(r.value)
        yield "erank", int(r.length), r.layer_type, int(r.layer), "erank_uncentered", float(r.uncentered)


def summarize(model: str, tables: Mapping[str, pd.DataFrame], threshold: float = 0.1) -> pd.DataFrame:
    """The ``analysis_summary`` rows of one model's tables (``{table name: frame}``)."""
    rows: list[Row] = []
    for metric in ("entropy", "reordering"):
        if metric in tables:
            rows += _means(metric, tables[metric])
    if "retrieval" in tables:
        rows += _retrieval(tables["retrieval"], threshold)
    if "erank" in tables:
        rows += _erank(tables["erank"])
    frame = pd.DataFrame(rows, columns=ANALYSIS_SUMMARY.names[1:])
    frame.insert(0, "model", model)
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


def statistic(summary: pd.DataFrame, metric: str, length: int, name: str, layer_type: str = "all") -> float:
    """One value of a summary table (raises ``KeyError`` when it holds none)."""
    hit = summary[
        (summary.metric == metric)
        & (summary.length == length)
        & (summary.statistic == name)
        & (summary.layer_type == layer_type)
    ]
    if hit.empty:
        raise KeyError(f"no {metric} {name} ({layer_type}) at length {length}")
    return float(hit["value"].iloc[0])
