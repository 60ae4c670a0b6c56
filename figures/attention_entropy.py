"""Attention entropy of every full-attention head, per member and run."""

from __future__ import annotations

from matplotlib.figure import Figure

from figures.data import Results
from figures.head_distribution import per_head
from figures.spec import Spec


def build(results: Results) -> Figure:
    return per_head(results, "entropy", "norm_value", "normalised attention entropy",
                    "Attention entropy of full-attention heads")  # fmt: skip


SPEC = Spec(
    "attention_entropy",
    "Attention entropy per head",
    "figure",
    ("entropy", "study_runs"),
    "Each dot one full-attention head (entropy / log of its visible keys, mean over analysed rows): low is "
    "focused, 1 is uniform; retrieval needs focused heads at long range.",
    build,
)
