"""Which retrieval-head definition finds the heads a model needs (``headprobe ablate --score A,B,...``): per model and
head-set size, the needle-accuracy drop when each definition's top heads are ablated, beside the drop of random sets
of the same size.

From the ``ablation`` table: a top set of Wu's score is the condition ``top``, another definition's ``top:<name>``.
Accuracy is pooled over tasks, lengths and depths, each weighted by its prompts (``n``); a random set's drop is the
mean over its seeds, with their range.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures import models, style
from figures.data import MissingInput, Results
from figures.spec import Spec

KEYS = ["condition", "mode", "heads", "n_heads", "seed", "task", "length", "depth"]
PER_ROW = 3  # panels per row


def definition_of(condition: str) -> str | None:
    """The definition a top set was ranked by (``top``: Wu's ``retrieval``); ``None`` for other conditions."""
    if condition == "top":
        return "retrieval"
    return condition.removeprefix("top:") if condition.startswith("top:") else None


def drops(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per model x mode x set size x set: ``definition`` (or ``random``), the pooled ``accuracy``, the
    model's baseline accuracy on the same prompts, and ``drop`` = baseline - accuracy (random: one row per seed)."""
    work = frame.assign(mode=frame["mode"].fillna("none"), heads=frame["heads"].fillna(""))
    pooled = models.weighted_mean(work, ["model", "condition", "mode", "n_heads", "seed"], "accuracy", "n")
    base = pooled[pooled["condition"] == "baseline"].set_index("model")["accuracy"]
    sets = pooled[pooled["condition"] != "baseline"].copy()
    sets["definition"] = [definition_of(c) or c for c in sets["condition"]]
    sets = sets[sets["definition"] != "heads"]
    sets["baseline"] = sets["model"].map(base)
    sets["drop"] = sets["baseline"] - sets["accuracy"]
    return sets


def _panel(ax: Axes, rows: pd.DataFrame, title: str) -> None:
    """One model, set size and mode: each definition's drop as a bar, largest first, the random sets' band."""
    tops = rows[rows.definition != "random"].sort_values("drop", ascending=False)
    names = list(tops["definition"])
    ax.bar(range(len(names)), tops["drop"], color="#c0392b", label="top set")
    random = rows[rows.definition == "random"]["drop"]
    if len(random):
        ax.axhspan(random.min(), random.max(), color="0.85", zorder=0, label=f"random sets ({len(random)} seeds)")
        ax.axhline(random.mean(), color="0.4", linewidth=0.8, linestyle="--", label="random mean")
    ax.axhline(0, color="k", linewidth=0.6)
    ax.axhline(float(rows["baseline"].iloc[0]), color="k", linewidth=0.6, linestyle=":",
               label="baseline: every answer lost")  # fmt: skip
    ax.grid(axis="x", visible=False)
    if float(rows["baseline"].iloc[0]) == 0:
        ax.text(0.5, 0.5, "baseline 0: unablated it answers\nno needle, so nothing can drop", ha="center",
                va="center", fontsize=6, transform=ax.transAxes)  # fmt: skip
    ax.set_xticks(np.arange(len(names)), names, rotation=45, ha="right", fontsize=6)
    ax.set_title(title, fontsize=7)
    ax.set_ylabel("needle accuracy drop")


def build(results: Results) -> Figure:
    frame = results.models("ablation", KEYS)
    sets = drops(frame)
    ranked = sets[sets["definition"] != "random"]
    if ranked["definition"].nunique() < 2:
        raise MissingInput("the 'ablation' table ranks top sets by one definition: `headprobe ablate --score A,B` "
                           "ranks them by two or more")  # fmt: skip
    panels = sorted(sets.groupby(["model", "n_heads", "mode"]).groups)
    ncols = min(len(panels), PER_ROW)
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(style.FULL_WIDTH, 3.0 * nrows), squeeze=False)
    for ax, (model, k, mode) in zip(axes.flat, panels, strict=False):
        rows = sets[(sets.model == model) & (sets.n_heads == k) & (sets["mode"] == mode)]
        _panel(ax, rows, f"{model}\ntop {int(k)} ({mode}), baseline {float(rows['baseline'].iloc[0]):.2f}")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=4, frameon=False, fontsize=6)
    return fig


SPEC = Spec(
    "definition_ablation",
    "Which retrieval-head definition finds the heads a model needs",
    "figure",
    ("ablation",),
    "One panel per model, head-set size and ablation mode: the needle-accuracy drop (baseline minus ablated, "
    "pooled over tasks, lengths and depths) when each definition's top heads are ablated, largest first; the grey "
    "band spans the "
    "random sets of the same size (dashed: their mean), the dotted line is the baseline (a bar reaching it lost "
    "every answer). A definition whose bar stands above the band found heads the model needs more than any heads.",
    build,
    "model",
)
