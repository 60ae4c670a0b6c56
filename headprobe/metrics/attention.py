"""Attention entropy and token reordering: per-head means of exact per-row statistics (docs/metrics.md)."""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from headprobe.metrics.heads import HeadAccumulator, head_frame
from headprobe.metrics.passes import run_pass
from headprobe.model.config import LayerInfo
from headprobe.probe.base import ProbedModel
from headprobe.results import Column, Schema
from headprobe.stats import AttentionStats

HEAD_COLUMNS = (
    Column("layer", "int", "0-based layer index"),
    Column("head", "int", "query head"),
    Column("layer_type", "str", "sliding or full"),
)

ENTROPY = Schema(
    "entropy",
    (
        *HEAD_COLUMNS,
        Column("value", "float", "mean attention entropy over the analysed rows (nats)"),
        Column("norm_value", "float", "mean of entropy / log(visible keys)"),
        Column("max_prob", "float", "mean largest attention probability"),
        Column("mean_distance", "float", "mean expected distance i - j (tokens)"),
    ),
)
REORDERING = Schema(
    "reordering",
    (*HEAD_COLUMNS, Column("value", "float", "mean normalised Kendall distance, top-k order vs recency")),
)


def kendall_reordering(topk_idx: Tensor) -> Tensor:
    """Normalised Kendall distance between attention order and recency order, per row.

    ``topk_idx [..., k]`` holds key positions sorted by attention probability (largest first), ``-1``
    for missing entries. A pair ranked ``a`` before ``b`` by attention disagrees with recency when ``a``
    is older (smaller position) than ``b``. Returns the fraction of disagreeing pairs (NaN for rows
    with fewer than two keys).
    """
    valid = topk_idx >= 0
    n = valid.sum(-1)
    older = topk_idx[..., :, None] < topk_idx[..., None, :]  # [..., a, b]: a is older than b
    k = topk_idx.shape[-1]
    later = torch.triu(torch.ones(k, k, dtype=torch.bool, device=topk_idx.device), diagonal=1)  # b after a
    both = valid[..., :, None] & valid[..., None, :]
    discordant = (older & later & both).sum((-1, -2)).double()
    pairs = (n * (n - 1) / 2).double()
    return torch.where(n >= 2, discordant / pairs.clamp(min=1), torch.full_like(pairs, math.nan))


class EntropyCollector:
    """Mean entropy, normalised entropy, max probability and mean distance per head."""

    heads, residual, topk = True, False, 0
    _STATS = ("entropy", "norm_entropy", "max_prob", "mean_distance")

    def __init__(self, layers: list[LayerInfo]) -> None:
        self.layers, self.acc = layers, HeadAccumulator()

    def attention(self, layer: int, stats: AttentionStats) -> None:
        for name in self._STATS:
            self.acc.add(layer, name, getattr(stats, name))

    def residual_stream(self, layer: int, x: Tensor) -> None:
        raise AssertionError("entropy needs no residual stream")

    def frame(self) -> pd.DataFrame:
        columns = {"value": "entropy", "norm_value": "norm_entropy", "max_prob": "max_prob"}
        return head_frame(self.layers, self.acc, columns | {"mean_distance": "mean_distance"})


class ReorderingCollector:
    """Mean normalised Kendall distance between each row's top-``k`` attention order and recency."""

    heads, residual = True, False

    def __init__(self, layers: list[LayerInfo], k: int) -> None:
        if k < 2:
            raise ValueError(f"token reordering needs `topk` >= 2, got {k}")
        self.layers, self.topk, self.acc = layers, k, HeadAccumulator()

    def attention(self, layer: int, stats: AttentionStats) -> None:
        self.acc.add(layer, "reordering", kendall_reordering(stats.topk_idx[..., : self.topk]))

    def residual_stream(self, layer: int, x: Tensor) -> None:
        raise AssertionError("token reordering needs no residual stream")

    def frame(self) -> pd.DataFrame:
        return head_frame(self.layers, self.acc, {"value": "reordering"})


def attention_entropy(model: ProbedModel, input_ids: Tensor, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean attention entropy (nats) per head over the analysed rows of every input; ``norm_value`` is the
    mean of entropy / log(visible keys). Also ``max_prob`` and ``mean_distance`` means."""
    c = EntropyCollector(model.layers)
    run_pass(model, input_ids, [c], rows)
    return c.frame()


def token_reordering(model: ProbedModel, input_ids: Tensor, k: int = 16, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean normalised Kendall distance between each row's top-``k`` attention order and recency order
    (0 = follows recency, 0.5 = unrelated, 1 = reversed)."""
    c = ReorderingCollector(model.layers, k)
    run_pass(model, input_ids, [c], rows)
    return c.frame()


def head_statistics(
    model: ProbedModel, input_ids: Tensor, rows: Tensor | None = None, k: int = 16
) -> dict[str, pd.DataFrame]:
    """Entropy and token reordering from one pass: ``{"entropy": ..., "reordering": ...}``."""
    ent, reo = EntropyCollector(model.layers), ReorderingCollector(model.layers, k)
    run_pass(model, input_ids, [ent, reo], rows)
    return {"entropy": ent.frame(), "reordering": reo.frame()}
