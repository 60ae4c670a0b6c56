"""One forward pass per input feeds every pass metric; nothing ``L x L`` is kept.

A pass runs the model once with a hook at the seam: each attention call's exact statistics are
computed once by :func:`headprobe.stats.attention_stats` (with the largest top-k any collector asks
for) and handed to every :class:`HeadCollector`; residual streams to every :class:`ResidualCollector`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import pandas as pd
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.model.seam import AttentionCall
from headprobe.stats import AttentionStats, attention_stats


@runtime_checkable
class HeadCollector(Protocol):
    """Folds per-head attention statistics into one tidy table."""

    topk: int  # top-k keys per row it needs (0 = none)

    def attention(self, layer: int, stats: AttentionStats) -> None: ...

    def frame(self) -> pd.DataFrame: ...


@runtime_checkable
class ResidualCollector(Protocol):
    """Folds residual streams into one tidy table."""

    def residual_stream(self, layer: int, x: Tensor) -> None: ...

    def frame(self) -> pd.DataFrame: ...


Collector = HeadCollector | ResidualCollector  # what a pass metric contributes to a pass


def run_pass(model: HookedModel, input_ids: Tensor, collectors: Sequence[Collector], rows: Tensor | None) -> None:
    """One forward pass over ``input_ids [batch, seq]`` at the query ``rows`` (``None`` = all) into ``collectors``."""
    heads = [c for c in collectors if isinstance(c, HeadCollector)]
    residual = [c for c in collectors if isinstance(c, ResidualCollector)]
    topk = max((c.topk for c in heads), default=0)

    def hook(call: AttentionCall) -> None:
        st = attention_stats(call.q, call.k, window=call.window, scale=call.scale, rows=rows, topk=topk)
        for c in heads:
            c.attention(call.layer, st)

    def stream(layer: int, x: Tensor) -> None:
        x = x if rows is None else x[:, rows.to(x.device)]
        for c in residual:
            c.residual_stream(layer, x)

    model.run(input_ids, hook=hook if heads else None, residual=stream if residual else None)
