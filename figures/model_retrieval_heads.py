"""Retrieval score of every head of any model: a layer x head heatmap per model (``headprobe analyze``'s
``retrieval`` table), layer types on a strip beside it."""

from __future__ import annotations

import math

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from figures import models, plot
from figures.data import MissingInput, Results
from figures.spec import Spec

THRESHOLD = 0.1  # a retrieval head scores at least this (the study's definition, docs/metrics.md)
PER_ROW = 4  # models side by side before the panels wrap
CMAP = "viridis"
NO_SCORE = (0.78, 0.78, 0.78, 1.0)  # a head whose model answered no needle sample: grey
KEYS = ["length", "layer", "head"]


def head_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """One model's heads pooled over lengths: the mean of each length's score weighted by its kept samples
    (the score over every kept sample of the sweep; NaN when none was kept), with ``n_kept`` summed."""
    pooled = models.weighted_mean(frame, ["layer", "head"], "value", "n_kept")
    types = frame.drop_duplicates(["layer"]).set_index("layer")["layer_type"]
    return pooled.assign(layer_type=pooled["layer"].map(types))


def matrix(heads: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, present)``, both ``[layers, max heads]``: each head's score (NaN where it has none or
    the layer has fewer heads) and whether the head exists."""
    n_layers, n_heads = int(heads.layer.max()) + 1, int(heads["head"].max()) + 1
    scores = np.full((n_layers, n_heads), np.nan)
    present = np.zeros((n_layers, n_heads), dtype=bool)
    layer, head = heads["layer"].to_numpy(int), heads["head"].to_numpy(int)
    scores[layer, head] = heads["value"].to_numpy(float)
    present[layer, head] = True
    return scores, present


def _samples(frame: pd.DataFrame) -> tuple[int, int, list[int]]:
    """Kept and decoded needle samples over the lengths, and the lengths."""
    per_length = frame.drop_duplicates("length")
    return int(per_length.n_kept.sum()), int(per_length.n_samples.sum()), sorted(per_length.length.astype(int))


def _ticks(n: int, most: int) -> list[int]:
    step = max(1, math.ceil(n / most))
    return list(range(0, n, step))


def _panel(fig, strip_ax, ax, model: str, frame: pd.DataFrame, norm: Normalize) -> None:
    heads = head_scores(frame)
    scores, present = matrix(heads)
    n_layers, n_heads = scores.shape
    image = ax.imshow(np.ma.masked_invalid(scores), cmap=CMAP, norm=norm, aspect="auto", interpolation="nearest")
    image.set_gid(f"scores:{model}")
    # heads without a score (no sample kept) in grey; heads a layer lacks stay blank (the axes' white)
    no_score = np.zeros((n_layers, n_heads, 4))
    no_score[present & np.isnan(scores)] = NO_SCORE
    ax.imshow(no_score, aspect="auto", interpolation="nearest").set_gid(f"no-score:{model}")
    hits = np.argwhere(present & (np.nan_to_num(scores, nan=-1.0) >= THRESHOLD))
    if len(hits):  # retrieval heads: a ring on the cell, white on dark colours, black on light ones
        light = norm(scores[hits[:, 0], hits[:, 1]]) > 0.6
        ax.scatter(hits[:, 1], hits[:, 0], s=9, facecolors="none", edgecolors=np.where(light, "black", "white"),
                   linewidths=0.6, label=f"_retrieval heads:{model}")  # fmt: skip
    ax.set_facecolor("white")
    ax.grid(False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(True)
    ax.set_xticks(np.arange(-0.5, n_heads), minor=True)
    ax.set_yticks(np.arange(-0.5, n_layers), minor=True)
    ax.grid(which="minor", color="white", linewidth=0.3)
    ax.tick_params(which="minor", length=0)
    ax.set_xticks(_ticks(n_heads, 16))
    ax.set_yticks(_ticks(n_layers, 48))
    ax.tick_params(labelleft=False, left=False)
    ax.set_xlabel("head")
    kept, decoded, lengths = _samples(frame)
    at = ", ".join(plot.length_label(n) for n in lengths)
    n_hits = len(hits)
    if kept == 0:
        said = f"no needle sample answered (0 of {decoded}):\nno head has a score (grey)"
    else:
        said = f"kept {kept} of {decoded} needle samples\n{n_hits} of {int(present.sum())} heads ≥ {THRESHOLD:g}"
    ax.set_title(f"{model}\n{said} · {at} tokens", fontsize=6)
    # the strip: each layer's type as a colour and a letter
    types = heads.drop_duplicates("layer").set_index("layer")["layer_type"].reindex(range(n_layers))
    colors = np.array([mpl.colors.to_rgba(models.layer_type_color(t)) for t in types.fillna("?")])
    strip_ax.imshow(colors[:, None, :], aspect="auto", interpolation="nearest").set_gid(f"layer-types:{model}")
    strip_ax.grid(False)
    strip_ax.set_xticks([])
    strip_ax.set_yticks(_ticks(n_layers, 48))
    strip_ax.set_ylabel("layer")
    strip_ax.tick_params(which="minor", left=False)
    if n_layers <= 64:
        for i, t in enumerate(types.fillna("?")):
            dark = sum(mpl.colors.to_rgb(models.layer_type_color(t))) < 1.5
            strip_ax.text(0, i, models.letter(t), ha="center", va="center", fontsize=4.5,
                          color="white" if dark else "black")  # fmt: skip


def _images(fig) -> list:
    return [im for ax in fig.axes for im in ax.get_images() if im.get_gid()]


def build(results: Results) -> Figure:
    frame = results.models("retrieval", KEYS)
    frame = frame[frame["layer"].notna() & frame["head"].notna()]
    if frame.empty:
        raise MissingInput("the 'retrieval' tables hold no head")
    names = models.model_order(frame.model)
    finite = frame["value"].dropna()
    top = max(THRESHOLD * 2, float(finite.max()) if len(finite) else 1.0)
    norm = Normalize(0.0, top)
    layers = frame.groupby("model")["layer"].max() + 1
    heads = frame.groupby("model")["head"].max() + 1
    n_cols = min(PER_ROW, len(names))
    n_rows = math.ceil(len(names) / n_cols)
    col_heads = [max(int(heads[m]) for m in names[c::n_cols]) for c in range(n_cols)]
    # inches: a heatmap 0.2 wide per head (1 to 4.5 in all), 0.13 high per layer (at most 6 in all); the
    # grid's width ratios are the widths of the strips, heatmaps and colour bar
    heat_w = [min(max(h * 0.2, 1.0), 4.5) for h in col_heads]
    cell_h = min(0.13, 6.0 / int(layers.max()))
    strip_w, bar_w = 0.14, 0.07
    ratios = [w for hw in heat_w for w in (strip_w, hw)] + [bar_w]
    width = sum(hw + strip_w + 0.55 for hw in heat_w) + bar_w + 0.6
    height = n_rows * (int(layers.max()) * cell_h + 1.0) + 0.35
    fig = plt.figure(figsize=(max(width, 3.0), max(height, 2.4)))
    grid = fig.add_gridspec(n_rows, 2 * n_cols + 1, width_ratios=ratios, wspace=0.02)
    for i, model in enumerate(names):
        r, c = divmod(i, n_cols)
        strip_ax = fig.add_subplot(grid[r, 2 * c])
        ax = fig.add_subplot(grid[r, 2 * c + 1], sharey=strip_ax)
        _panel(fig, strip_ax, ax, model, frame[frame.model == model], norm)
    bar = fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=CMAP), cax=fig.add_subplot(grid[:, -1]))
    bar.set_label("retrieval score (Wu et al.'s code: copies / span, repeats counted)")
    bar.ax.axhline(THRESHOLD, color="white", linewidth=1.0)
    bar.ax.axhline(THRESHOLD, color="k", linewidth=0.5, linestyle=(0, (2, 2)))
    handles = []  # only what the panels show
    if any(im.get_gid().startswith("no-score:") and im.get_array()[..., 3].any() for im in _images(fig)):
        handles.append(Patch(facecolor=NO_SCORE, edgecolor="0.5", linewidth=0.4, label="no score (no sample kept)"))
    if (frame.groupby("model")["head"].nunique() * frame.groupby("model")["layer"].nunique()
            > frame.drop_duplicates(["model", "layer", "head"]).groupby("model").size()).any():  # fmt: skip
        handles.append(Patch(facecolor="white", edgecolor="0.5", linewidth=0.4, label="no such head"))
    if any(str(c.get_label()).startswith("_retrieval heads:") for ax in fig.axes for c in ax.collections):
        handles.append(plt.Line2D([], [], marker="o", markersize=3, markerfacecolor="none", markeredgecolor="0.2",
                                  linestyle="", label=f"retrieval head (pooled score ≥ {THRESHOLD:g})"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=max(len(handles), 1), frameon=False, fontsize=5,
               title=models.layer_types_legend(frame.layer_type), title_fontsize=5)  # fmt: skip
    return fig


SPEC = Spec(
    "model_retrieval_heads",
    "Retrieval score of every head, per model",
    "figure",
    ("retrieval",),
    "A panel per model: a row per layer (strip: S sliding, F full), a column per head, colour = retrieval "
    "score as Wu et al.'s code counts it (needle-token copies / answer-span length, a repeated copy counted "
    "again, so a model that repeats its answer scores above 1; the paper's set form, each needle token once, "
    "is the tables' set_value); over every answered needle sample of the lengths, so pooled weighting each "
    "length by its kept samples; ringed heads score >= 0.1, grey heads have no score (no sample kept), blank "
    "cells are heads the layer lacks.",
    build,
    "model",
)
