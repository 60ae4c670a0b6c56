"""Attention entropy and token reordering: per-head means of exact per-row statistics (docs/metrics.md)."""

from __future__ import annotations

import math

import pandas as pd
import torch
from torch import Tensor

from headprobe.core.errors import SettingError
from headprobe.hooked.base import HookedModel
from headprobe.metrics.heads import HeadAccumulator, head_frame
from headprobe.metrics.passes import run_pass
from headprobe.model.budget import kendall_chunk
from headprobe.model.config import LayerInfo
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
    (*HEAD_COLUMNS, Column("value", "float", "mean probability-weighted Kendall distance, top-k order vs recency")),
)


def kendall_reordering(topk_idx: Tensor, topk_prob: Tensor, chunk: int | None = None) -> Tensor:
    """Probability-weighted normalised Kendall distance between attention order and recency, per row.

    ``topk_idx [..., k]`` holds key positions, ``topk_prob [..., k]`` their probabilities (``-1`` and
    ``0`` for missing entries). Each pair of keys ``(a, b)`` weighs ``p_a * p_b`` and disagrees with
    recency when the more probable key is the older one; a pair of equal probabilities counts half.
    The row's value is the weighted share of disagreeing pairs: 0 = attention falls off with recency,
    0.5 = unrelated (a uniform row is exactly 0.5), 1 = reversed. Keys with almost no attention weigh
    almost nothing, so their arbitrary order cannot swamp the keys that matter. NaN for rows with fewer
    than two keys. Rows are taken ``chunk`` at a time (``[chunk, k, k]`` pairs in memory; by default as many
    as :func:`headprobe.model.budget.kendall_chunk` allows, which the memory estimate counts).
    """
    shape, k = topk_idx.shape[:-1], topk_idx.shape[-1]
    chunk = chunk or kendall_chunk(k)
    idx, prob = topk_idx.reshape(-1, k), topk_prob.reshape(-1, k).double()
    out = torch.empty(idx.shape[0], dtype=torch.float64, device=idx.device)
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=idx.device), diagonal=1)  # each pair once
    for lo in range(0, idx.shape[0], chunk):
        i, p = idx[lo : lo + chunk], prob[lo : lo + chunk]
        valid = i >= 0
        pairs = upper & valid[:, :, None] & valid[:, None, :]
        pa, pb = p[:, :, None], p[:, None, :]
        older = i[:, :, None] < i[:, None, :]  # a is older than b
        disagree = torch.where(pa == pb, 0.5, ((pa > pb) & older) | ((pa < pb) & ~older)).double()
        weight = torch.where(pairs, pa * pb, torch.zeros_like(pa))
        total = weight.sum((-1, -2))
        score = (weight * disagree).sum((-1, -2)) / total.clamp(min=1e-300)
        out[lo : lo + chunk] = torch.where((valid.sum(-1) >= 2) & (total > 0), score, math.nan)
    return out.reshape(shape)


class EntropyCollector:
    """Mean entropy, normalised entropy, max probability and mean distance per head."""

    topk = 0
    _STATS = ("entropy", "norm_entropy", "max_prob", "mean_distance")

    def __init__(self, layers: list[LayerInfo]) -> None:
        self.layers, self.acc = layers, HeadAccumulator()

    def attention(self, layer: int, stats: AttentionStats) -> None:
        for name in self._STATS:
            self.acc.add(layer, name, getattr(stats, name))

    def frame(self) -> pd.DataFrame:
        columns = {"value": "entropy", "norm_value": "norm_entropy", "max_prob": "max_prob"}
        return head_frame(self.layers, self.acc, columns | {"mean_distance": "mean_distance"})


class ReorderingCollector:
    """Mean probability-weighted Kendall distance between each row's top-``k`` attention order and recency."""

    def __init__(self, layers: list[LayerInfo], k: int) -> None:
        if k < 2:
            raise SettingError(f"token reordering needs `topk` >= 2, got {k}")
        self.layers, self.topk, self.acc = layers, k, HeadAccumulator()

    def attention(self, layer: int, stats: AttentionStats) -> None:
        k = self.topk
        self.acc.add(layer, "reordering", kendall_reordering(stats.topk_idx[..., :k], stats.topk_prob[..., :k]))

    def frame(self) -> pd.DataFrame:
        return head_frame(self.layers, self.acc, {"value": "reordering"})


def attention_entropy(model: HookedModel, input_ids: Tensor, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean attention entropy (nats) per head over the analysed rows of every input; ``norm_value`` is the
    mean of entropy / log(visible keys). Also ``max_prob`` and ``mean_distance`` means."""
    c = EntropyCollector(model.layers)
    run_pass(model, input_ids, [c], rows)
    return c.frame()


def token_reordering(model: HookedModel, input_ids: Tensor, k: int = 16, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean probability-weighted Kendall distance between each row's top-``k`` attention order and
    recency order (0 = follows recency, 0.5 = unrelated, 1 = reversed; :func:`kendall_reordering`)."""
    c = ReorderingCollector(model.layers, k)
    run_pass(model, input_ids, [c], rows)
    return c.frame()


def head_statistics(
    model: HookedModel, input_ids: Tensor, rows: Tensor | None = None, k: int = 16
) -> dict[str, pd.DataFrame]:
    """Entropy and token reordering from one pass: ``{"entropy": ..., "reordering": ...}``."""
    ent, reo = EntropyCollector(model.layers), ReorderingCollector(model.layers, k)
    run_pass(model, input_ids, [ent, reo], rows)
    return {"entropy": ent.frame(), "reordering": reo.frame()}
