"""Effective rank of the residual stream per layer (Roy & Vetterli 2007; docs/metrics.md)."""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from headprobe.core.errors import HeadprobeError
from headprobe.hooked.base import HookedModel
from headprobe.metrics.passes import run_pass
from headprobe.model.config import LayerInfo
from headprobe.results import Column, Schema

ERANK = Schema(
    "erank",
    (
        Column("layer", "int", "-1 = the embedding output, else the block whose output it is"),
        Column("site", "str", "embed or block_out"),
        Column("layer_type", "str", "sliding, full, or embedding"),
        Column("value", "float", "effective rank of the residual stream (Roy & Vetterli: no centring)"),
        Column("centered", "float", "effective rank after subtracting the mean position"),
        Column("tokens", "int", "positions pooled"),
    ),
)


class NonFiniteError(HeadprobeError, ValueError):
    """A model's activations are not finite numbers, so a metric of them does not exist."""


def _erank_from_gram(gram: Tensor) -> float:
    eig = torch.linalg.eigvalsh(gram.double()).clamp(min=0)
    sigma = eig.sqrt()
    total = sigma.sum()
    if total <= 0:
        return 0.0
    p = sigma / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def effective_rank(x: Tensor, center: bool = False) -> float:
    """Roy & Vetterli's effective rank of ``x [N, D]``: ``exp(H(p))`` with ``p = sigma / sum(sigma)``,
    from the ``D x D`` Gram matrix (so ``N`` may be large). As documented (docs/metrics.md) and as the
    tables' ``value``, the stream is not centred; ``center`` subtracts the mean row first (the tables'
    ``centered``)."""
    x = x.double()
    if center:
        x = x - x.mean(0, keepdim=True)
    return _erank_from_gram(x.T @ x)


class GramAccumulator:
    """``X^T X``, column sums and row count of one layer's residual stream, accumulated in float64."""

    def __init__(self) -> None:
        self.gram: Tensor | None = None
        self.colsum: Tensor | None = None
        self.n = 0

    def add(self, x: Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        g, c = x.T @ x, x.sum(0)
        self.gram = g if self.gram is None else self.gram + g
        self.colsum = c if self.colsum is None else self.colsum + c
        self.n += x.shape[0]

    def erank(self, center: bool) -> float:
        assert self.gram is not None and self.colsum is not None
        if not center:
            return _erank_from_gram(self.gram)
        mean = self.colsum / self.n
        return _erank_from_gram(self.gram - self.n * torch.outer(mean, mean))


class ErankCollector:
    """Residual-stream Gram matrices per site, pooled over every input it sees."""

    def __init__(self, layers: list[LayerInfo]) -> None:
        self.types = {info.index: str(info.layer_type) for info in layers}
        self.grams: dict[int, GramAccumulator] = {}

    def residual_stream(self, layer: int, x: Tensor) -> None:
        self.grams.setdefault(layer, GramAccumulator()).add(x)

    def frame(self) -> pd.DataFrame:
        """One row per residual site: the embedding output (``layer = -1``) and every block's output; a stream
        that is not all finite numbers is refused (:class:`NonFiniteError`): its eigenvalues do not exist."""
        for layer, acc in sorted(self.grams.items()):
            if acc.gram is not None and not bool(torch.isfinite(acc.gram).all()):
                site = "the embedding output" if layer < 0 else f"the output of block {layer}"
                raise NonFiniteError(
                    f"the residual stream holds values that are not finite numbers (NaN or inf) at {site}, so its "
                    "effective rank does not exist: the model overflows in this dtype (try `dtype` float32) or its "
                    "weights are not finite (trained until it diverged?)"
                )
        return pd.DataFrame.from_records(
            {
                "layer": layer,
                "site": "embed" if layer < 0 else "block_out",
                "layer_type": self.types.get(layer, "embedding"),
                "value": acc.erank(center=False),
                "centered": acc.erank(center=True),
                "tokens": acc.n,
            }
            for layer, acc in sorted(self.grams.items())
        )


def residual_effective_rank(model: HookedModel, input_ids: Tensor, rows: Tensor | None = None) -> pd.DataFrame:
    """Effective rank of the residual stream after the embedding (``layer = -1``, ``site = "embed"``)
    and after every block (``site = "block_out"``), pooling the analysed positions of all inputs.
    ``value`` is Roy & Vetterli's effective rank (no centring), ``centered`` that of the centred stream."""
    c = ErankCollector(model.layers)
    run_pass(model, input_ids, [c], rows)
    return c.frame()
