"""How far the retrieval-head definitions agree, for any model (``headprobe analyze`` with two definitions or more:
the ``head_agreement`` table): per model, the Spearman correlation of every pair of definitions over its heads
(left), and its two least agreeing definitions' scores head by head (right)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures import models, style
from figures.data import MissingInput, Results
from figures.spec import Spec

KEYS = ["length", "layer_type", "definition_a", "definition_b"]
LABELLED = 3  # heads named in the scatter: each definition's top three


def definition_order(pairs: pd.DataFrame) -> list[str]:
    """The definitions in the table's order (the registry's: each pair is written ``a`` before ``b``)."""
    return list(dict.fromkeys([*pairs["definition_a"], *pairs["definition_b"]]))


def spearman_matrix(pairs: pd.DataFrame, names: list[str]) -> np.ndarray:
    """``[names, names]`` Spearman correlations from one model's rows at one length and layer type (NaN where
    undefined; 1 on the diagonal for a definition that scored some head, NaN for one that scored none)."""
    out = np.full((len(names), len(names)), math.nan)
    at = {n: i for i, n in enumerate(names)}
    scored = pairs[pairs["n_heads"] > 0]
    for name in set(scored["definition_a"]) | set(scored["definition_b"]):
        out[at[name], at[name]] = 1.0
    for r in pairs.itertuples():
        out[at[r.definition_a], at[r.definition_b]] = out[at[r.definition_b], at[r.definition_a]] = r.spearman
    return out


def least_agreeing(pairs: pd.DataFrame) -> tuple[str, str, float] | None:
    """The pair with the lowest Spearman correlation (``None`` when no pair has one)."""
    scored = pairs.dropna(subset=["spearman"])
    if scored.empty:
        return None
    r = scored.sort_values(["spearman", "definition_a", "definition_b"]).iloc[0]
    return str(r.definition_a), str(r.definition_b), float(r.spearman)


def _matrix(ax: Axes, matrix: np.ndarray, names: list[str], title: str) -> None:
    image = ax.imshow(np.ma.masked_invalid(matrix), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=6)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    for (i, j), v in np.ndenumerate(matrix):
        text = "–" if math.isnan(v) else f"{v:.2f}"
        ax.text(j, i, text, ha="center", va="center", fontsize=5, color="white" if abs(v) > 0.6 else "black")
    ax.set_title(title, fontsize=7)
    ax.grid(False)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="Spearman")


def _scatter(ax: Axes, results: Results, model: str, length: int, pair: tuple[str, str, float] | None) -> None:
    if pair is None:
        ax.text(0.5, 0.5, "no pair of definitions\nwith a correlation", ha="center", va="center", fontsize=7)
        ax.set_axis_off()
        return
    a, b, rho = pair
    frames = []
    for name in (a, b):
        table = results.models(name, ["length", "layer", "head"])
        frames.append(table[(table["model"] == model) & (table["length"] == length)])
    both = frames[0].merge(frames[1], on=["layer", "head", "layer_type"], suffixes=("_a", "_b"))
    for kind, rows in both.groupby("layer_type"):
        color = models.layer_type_color(str(kind))
        ax.scatter(rows["value_a"], rows["value_b"], s=8, alpha=0.7, label=str(kind), color=color)
    named = pd.concat([both.nlargest(LABELLED, "value_a"), both.nlargest(LABELLED, "value_b")]).drop_duplicates()
    for r in named.itertuples():  # each definition's top heads, named L<layer>H<head>
        ax.annotate(f"L{int(r.layer)}H{int(r.head)}", (r.value_a, r.value_b), fontsize=5, xytext=(2, 2),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel(a)
    ax.set_ylabel(b)
    ax.set_title(f"least agreeing pair: Spearman {rho:.2f}", fontsize=7)
    if both["layer_type"].nunique() > 1:
        ax.legend(fontsize=6, frameon=False)


def build(results: Results) -> Figure:
    frame = results.models("head_agreement", KEYS)
    names = models.model_order(frame.model)
    fig, axes = plt.subplots(len(names), 2, figsize=(style.FULL_WIDTH, 3.2 * len(names)), squeeze=False)
    for row, model in zip(axes, names, strict=True):
        mine = frame[(frame.model == model) & (frame.layer_type == "all")]
        if mine.empty:
            raise MissingInput(f"{model}: no 'head_agreement' rows over all heads")
        length = int(mine["length"].max())
        at = mine[mine.length == length]
        order = definition_order(at)
        _matrix(row[0], spearman_matrix(at, order), order, f"{model} at {length:,} tokens: all heads")
        _scatter(row[1], results, model, length, least_agreeing(at))
    return fig


SPEC = Spec(
    "head_agreement",
    "How far the retrieval-head definitions agree, per model",
    "figure",
    ("head_agreement",),
    "Left: the Spearman correlation between every two retrieval-head definitions over a model's heads, at its longest "
    "analysed length (red agree, blue disagree; – where undefined, e.g. Wu's score of a model that answered no "
    "needle). Right: the two least agreeing definitions' scores, one dot per head, coloured by layer type; each "
    "definition's top three heads named L<layer>H<head>.",
    build,
    "model",
)
