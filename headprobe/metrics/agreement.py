"""``head_agreement``: how far the retrieval-head definitions (:mod:`headprobe.metrics.definitions`) agree on one
model, per length and pair of definitions (docs/metrics.md, "Agreement").

For two definitions ``a`` and ``b`` at one length, over the heads where both have a number (all of them, and those of
each layer type apart: a sliding window far from the needle scores 0 by every definition, ties that weigh on the
correlation over all heads):

* ``spearman``: the rank correlation of the two scores (average ranks for ties; NaN with fewer than 3 heads or a
  constant score);
* ``jaccard``: ``|T_a & T_b| / |T_a | T_b|`` of each definition's top ``k`` heads (``k`` = a tenth of those heads,
  at least 1; ties to the lower layer, then head).

Each definition's score is its table's ``value``: Wu's for ``retrieval`` (NaN when no sample was kept, so a model
that answers no needle has no agreement row with a number for it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from headprobe.results import Column, Schema

DEFINITION_NAMES = ("retrieval", "retrieval_forced", "needle_mass", "query_focus", "echo", "induction", "logit_contrib")
TOP_SHARE = 0.1  # the top tenth of the heads

HEAD_AGREEMENT = Schema(
    "head_agreement",
    (
        Column("length", "int", "prompt tokens"),
        Column("layer_type", "str", "the heads compared: all, or those of one layer type (sliding, full)"),
        Column("definition_a", "str", "a retrieval-head definition (its table's name)"),
        Column("definition_b", "str", "another, later in the registry's order"),
        Column("n_heads", "int", "heads where both have a number"),
        Column("spearman", "float", "Spearman rank correlation of the two scores over those heads (NaN: undefined)"),
        Column("k", "int", "heads in each top set: a tenth of n_heads, at least 1 (0 when n_heads is 0)"),
        Column("jaccard", "float", "overlap of the two top-k sets over their union (0-1; NaN when n_heads is 0)"),
    ),
)


def top_heads(scores: pd.Series, k: int) -> set[tuple[int, int]]:
    """The ``k`` heads (``(layer, head)`` index) of largest score, ties to the lower layer, then head."""
    order = scores.reset_index().sort_values(["value", "layer", "head"], ascending=[False, True, True])
    return {(int(r.layer), int(r.head)) for r in order.head(k).itertuples()}


def pair_agreement(a: pd.Series, b: pd.Series) -> dict[str, float | int]:
    """``n_heads``, ``spearman``, ``k`` and ``jaccard`` of two scores indexed by ``(layer, head)``."""
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    n = len(both)
    if n == 0:
        return {"n_heads": 0, "spearman": math.nan, "k": 0, "jaccard": math.nan}
    ranks = both.rank()
    rho = ranks["a"].corr(ranks["b"]) if n >= 3 else math.nan
    k = max(1, round(TOP_SHARE * n))
    top_a, top_b = top_heads(both["a"].rename("value"), k), top_heads(both["b"].rename("value"), k)
    return {"n_heads": n, "spearman": float(rho), "k": k, "jaccard": len(top_a & top_b) / len(top_a | top_b)}


def head_agreement(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The ``head_agreement`` rows of one model from its head tables (``{definition: frame}`` with ``length``,
    ``layer``, ``head``, ``layer_type``, ``value``): every pair of the definitions present, at every length both
    have, over all heads and each layer type's."""
    names = [n for n in DEFINITION_NAMES if n in tables]
    lengths = sorted({int(n) for name in names for n in tables[name]["length"]})
    rows = []
    for length in lengths:
        at = {name: tables[name][tables[name]["length"] == length] for name in names}
        kinds = ["all", *sorted({str(t) for f in at.values() for t in f["layer_type"]})]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if at[a].empty or at[b].empty:
                    continue
                for kind in kinds:
                    a_part, b_part = (f if kind == "all" else f[f["layer_type"] == kind] for f in (at[a], at[b]))
                    scores = [f.set_index(["layer", "head"])["value"] for f in (a_part, b_part)]
                    rows.append({"length": length, "layer_type": kind, "definition_a": a, "definition_b": b}
                                | pair_agreement(*scores))  # fmt: skip
    return pd.DataFrame(rows, columns=HEAD_AGREEMENT.names)
