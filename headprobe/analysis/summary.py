"""``analysis_summary``: the aggregates of one model's analysis tables, as a derived tidy table.

One row per model x metric x length x layer type (x layer, for effective rank) x statistic; each
metric says which (:mod:`headprobe.metrics.summaries`):

=============  =========================================================================================
metric         statistics
=============  =========================================================================================
entropy        ``mean`` (nats) and ``norm_mean`` over heads and samples, per layer type and ``all``
reordering     ``mean`` per layer type and ``all``
retrieval      ``retrieval_heads`` (score >= threshold), ``heads``, ``fraction`` per layer type and ``all``;
               ``n_kept``, ``n_samples``, ``mean_score`` (``all``); ``forced_retrieval_heads``
               (``forced_value`` >= threshold, every sample counted), ``forced_fraction`` and
               ``forced_mass`` (mean over the heads), ``reading_heads`` (``forced_mass`` >= 0.1: needle-reading
               heads) and ``reading_fraction`` per layer type and ``all``
erank          ``erank`` (uncentred) and ``erank_centered`` per layer (``layer_type`` of that layer)
definitions    (``retrieval_forced``, ``needle_mass``, ``query_focus``, ``echo``, ``induction``, ``logit_contrib``)
               ``mean`` and ``max`` of ``value`` per layer type and ``all``; ``n_scored``, ``n_samples``,
               ``top_layer`` and ``top_head`` (the head of largest value; NaN when no sample was scored) (``all``)
=============  =========================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from headprobe.metrics import Metric
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


def summarize(model: str, tables: Mapping[str, pd.DataFrame], metrics: Sequence[Metric]) -> pd.DataFrame:
    """The ``analysis_summary`` rows of one model's tables (``{table name: frame}``): each metric's own
    summary rows (:attr:`headprobe.metrics.PassMetric.summary`) under its name."""
    rows = [(m.name, *row) for m in metrics for row in m.summary(tables[m.tables[0].table])]
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
