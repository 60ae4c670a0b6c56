"""Shared by the per-model figures (``model_retrieval_heads``, ``model_layers``, ``model_ruler``,
``ablation``): any model's results, one panel or one colour per model, with no study around them.

Models are named by their results folder (``OUT/<model>/``), so their names state no head shape: they get
colours of a qualitative palette in name order, the same model the same colour in every per-model figure.
"""

from __future__ import annotations

from collections.abc import Iterable

import matplotlib as mpl
import pandas as pd

LAYER_TYPE_LETTERS = {"sliding": "S", "full": "F", "embedding": "E"}
LAYER_TYPE_COLORS = {"sliding": "#b8d4ea", "full": "#2b5d8a", "embedding": "0.6"}


def model_order(models: Iterable[str]) -> list[str]:
    """Models in the order every per-model figure lists them: by name."""
    return sorted({str(m) for m in models})


def model_colors(models: Iterable[str]) -> dict[str, tuple[float, float, float, float]]:
    """A colour per model (tab10 in name order, cycling past ten)."""
    cmap = mpl.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(model_order(models))}


def letter(layer_type: str) -> str:
    """One letter for a layer type: S (sliding window), F (full attention), else its first letter."""
    return LAYER_TYPE_LETTERS.get(str(layer_type), str(layer_type)[:1].upper() or "?")


def layer_type_color(layer_type: str) -> str:
    return LAYER_TYPE_COLORS.get(str(layer_type), "0.8")


def layer_types_legend(types: Iterable[str]) -> str:
    """``S = sliding window, F = full attention`` for the types present."""
    names = {"sliding": "sliding window", "full": "full attention", "embedding": "embedding"}
    return ", ".join(f"{letter(t)} = {names.get(t, t)}" for t in sorted(set(map(str, types)), key=_type_key))


def _type_key(layer_type: str) -> tuple[int, str]:
    order = ["sliding", "full", "embedding"]
    return (order.index(layer_type) if layer_type in order else len(order), layer_type)


def weighted_mean(frame: pd.DataFrame, keys: list[str], value: str, weight: str) -> pd.DataFrame:
    """``value`` averaged within each group of ``keys`` weighting each row by ``weight`` (rows whose
    value is NaN or weight 0 count for nothing; NaN where no weight is left), with the summed weight.
    Columns: ``keys``, ``value``, ``weight``."""
    finite = frame[value].notna() & (frame[weight] > 0)
    work = frame.assign(_w=frame[weight].where(finite, 0).astype(float))
    work = work.assign(_vw=work[value].where(finite, 0.0).astype(float) * work["_w"])
    sums = work.groupby(keys, dropna=False, sort=True)[["_vw", "_w"]].sum().reset_index()
    sums[value] = (sums["_vw"] / sums["_w"]).where(sums["_w"] > 0)
    sums[weight] = sums["_w"]
    return sums[[*keys, value, weight]]
