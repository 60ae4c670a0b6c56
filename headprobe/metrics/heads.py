"""Per-(layer, head) means of row statistics, and the tidy per-head table they become."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprobe.model.config import LayerInfo


class HeadAccumulator:
    """Running per-(layer, head) sums of row statistics over rows and samples (NaNs skipped)."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, str], Tensor] = {}
        self.counts: dict[tuple[int, str], Tensor] = {}

    def add(self, layer: int, name: str, values: Tensor) -> None:
        """``values [batch, heads, rows]``."""
        ok = ~torch.isnan(values)
        total = torch.where(ok, values, torch.zeros_like(values)).double().sum((0, 2)).cpu()
        count = ok.sum((0, 2)).cpu()
        key = (layer, name)
        self.sums[key] = self.sums.get(key, 0) + total
        self.counts[key] = self.counts.get(key, 0) + count

    def mean(self, layer: int, name: str) -> np.ndarray:
        s, c = self.sums[(layer, name)], self.counts[(layer, name)]
        return (s / c.clamp(min=1)).where(c > 0, torch.tensor(math.nan, dtype=torch.float64)).numpy()


def head_frame(layers: list[LayerInfo], acc: HeadAccumulator, columns: Mapping[str, str]) -> pd.DataFrame:
    """One row per layer x head: ``layer``, ``head``, ``layer_type`` and ``column = mean of statistic`` for
    each ``columns`` entry (``{"value": "entropy", ...}``)."""
    records = []
    for info in layers:
        means = {name: acc.mean(info.index, stat) for name, stat in columns.items()}
        for head in range(info.n_heads):
            records.append(
                {"layer": info.index, "head": head, "layer_type": str(info.layer_type)}
                | {name: float(col[head]) for name, col in means.items()}
            )
    return pd.DataFrame.from_records(records)
