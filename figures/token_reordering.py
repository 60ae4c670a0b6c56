"""Token reordering of every full-attention head, per member and run."""

from __future__ import annotations

from matplotlib.figure import Figure

from figures.data import Results
from figures.head_distribution import per_head
from figures.spec import Spec


def build(results: Results) -> Figure:
    return per_head(results, "reordering", "value", "token reordering (weighted Kendall)",
                    "Token reordering of full-attention heads")  # fmt: skip


SPEC = Spec(
    "token_reordering",
    "Token reordering per head",
    "figure",
    ("reordering", "study_runs"),
    "Each dot one full-attention head: 0 = attention falls off with recency, 0.5 = unrelated to position, "
    "1 = reversed (docs/metrics.md); retrieval heads sit well above 0.",
    build,
)
