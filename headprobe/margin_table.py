"""The needle-margin table, ``needle_margin``, as its readers see it: each head's means over the samples, and each
model's top heads by mass on the needle.

:mod:`headprobe.metrics.margin` computes the table (and summarises it with :func:`head_means`); here only what
every reader shares, below the layers that compute or show it: ``headprobe show`` and the ``needle_margin``
figure (which may not import the metrics).
"""

from __future__ import annotations

import pandas as pd

MEANS = ["margin", "mass", "rank", "seen"]


def head_means(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model (when given), length, layer and head: ``margin``, ``mass``, ``rank`` and ``seen`` averaged over
    the samples (NaNs skipped), with the layer's type."""
    keys = [c for c in ("model", "length", "layer", "head", "layer_type") if c in frame]
    return frame.groupby(keys, sort=True)[MEANS].mean().reset_index()


def top_heads(frame: pd.DataFrame, top: int) -> pd.DataFrame:
    """Per model, its ``top`` heads by mass on the needle (the mean over lengths of :func:`head_means`; ties to the
    lower layer, then head), at every length: :func:`head_means` rows with ``place`` (0 = the most mass), ordered by
    model, place and length."""
    heads = head_means(frame)
    order = heads.groupby(["model", "layer", "head"])["mass"].mean().reset_index()
    order = order.sort_values(["model", "mass", "layer", "head"], ascending=[True, False, True, True])
    order["place"] = order.groupby("model").cumcount()
    chosen = order[order.place < top][["model", "layer", "head", "place"]]
    return heads.merge(chosen, on=["model", "layer", "head"]).sort_values(["model", "place", "length"])
