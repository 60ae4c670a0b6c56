"""Attention entropy and residual-stream effective rank by layer, for any model (``headprobe analyze``'s
``entropy`` and ``erank`` tables): a line per model and length, every head a dot."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from figures import models, plot, style
from figures.data import MissingInput, Results
from figures.spec import Spec

DASHES = ("-", "--", ":", "-.")  # a length per line style, the longest solid


def _length_styles(lengths) -> dict[int, str]:
    ordered = sorted({int(n) for n in lengths}, reverse=True)
    return {n: DASHES[i % len(DASHES)] for i, n in enumerate(ordered)}


def per_layer(frame: pd.DataFrame, value: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(heads, layers)``: ``value`` averaged per model x length x layer x head over samples, then per
    layer over heads (each head counting once), with the layer's type."""
    heads = frame.groupby(["model", "length", "layer", "head"], dropna=False)[value].mean().reset_index()
    types = frame.drop_duplicates(["model", "layer"])[["model", "layer", "layer_type"]]
    heads = heads.merge(types, on=["model", "layer"], how="left")
    layers = heads.groupby(["model", "length", "layer", "layer_type"], dropna=False)[value].mean().reset_index()
    return heads, layers


def _line(ax: Axes, rows: pd.DataFrame, y: str, color, linestyle: str, label: str) -> None:
    """A line through ``y`` by layer; each point filled for a full-attention layer, open for the others (a
    square for the embedding)."""
    rows = rows.sort_values("layer")
    ax.plot(rows.layer, rows[y], color=color, linestyle=linestyle, marker="", label=label)
    full, embed = rows.layer_type == "full", rows.layer_type == "embedding"
    ax.scatter(rows.layer[full], rows[y][full], s=9, color=color, zorder=3, label=f"_full:{label}")
    ax.scatter(rows.layer[~full & ~embed], rows[y][~full & ~embed], s=9, facecolors="white", edgecolors=color,
               linewidths=0.7, zorder=3, label=f"_other:{label}")  # fmt: skip
    ax.scatter(rows.layer[embed], rows[y][embed], s=9, marker="s", color=color, zorder=3, label=f"_embed:{label}")


def _entropy(ax: Axes, frame: pd.DataFrame, colors: dict, dashes: dict[int, str]) -> None:
    heads, layers = per_layer(frame, "norm_value")
    rng = np.random.default_rng(0)
    for (model, length), rows in layers.groupby(["model", "length"]):
        points = heads[(heads.model == model) & (heads.length == length)]
        jitter = rng.uniform(-0.18, 0.18, len(points))
        ax.scatter(points.layer + jitter, points.norm_value, s=2, color=colors[model], alpha=0.35, linewidths=0,
                   label=f"_heads:{model}:{int(length)}")  # fmt: skip
        _line(ax, rows, "norm_value", colors[model], dashes[int(length)], f"{model}:{int(length)}")
    ax.set_ylabel("attention entropy / log(visible keys)")
    ax.set_title("attention entropy (line: mean over heads; dots: heads)")
    ax.set_ylim(-0.02, 1.02)


def _erank(ax: Axes, frame: pd.DataFrame, colors: dict, dashes: dict[int, str]) -> None:
    frame = frame[frame.site.isin(["embed", "block_out"])] if "site" in frame else frame
    layers = frame.groupby(["model", "length", "layer", "layer_type"], dropna=False)["value"].mean().reset_index()
    for (model, length), rows in layers.groupby(["model", "length"]):
        _line(ax, rows, "value", colors[model], dashes[int(length)], f"{model}:{int(length)}")
    ax.set_ylabel("effective rank (Roy & Vetterli)")
    ax.set_title("residual-stream effective rank")
    last = int(layers.layer.max())
    ticks = [int(t) for t in MaxNLocator(nbins=8, integer=True).tick_values(0, last) if 0 <= t <= last]
    if layers.layer.min() < 0:  # the embedding output, before block 0 (whose label would touch it)
        ticks = [-1, *(t for t in ticks if t != 0 or last < 8)]
    ax.set_xticks(ticks, ["emb" if t == -1 else str(t) for t in ticks])


def build(results: Results) -> Figure:
    tables = {}
    for table, keys in (("entropy", ["length", "layer", "head", "sample"]), ("erank", ["length", "layer", "site"])):
        try:
            tables[table] = results.models(table, [k for k in keys if k in results.raw(table).columns])
        except MissingInput as err:
            why = str(err)
    if not tables:
        raise MissingInput(f"neither an 'entropy' nor an 'erank' table: {why}")
    names = models.model_order(pd.concat([t.model for t in tables.values()]))
    colors = models.model_colors(names)
    dashes = _length_styles(pd.concat([t.length for t in tables.values()]))
    fig, axes = plt.subplots(1, len(tables), figsize=(style.COLUMN_WIDTH * 1.05 * len(tables), 2.6), squeeze=False)
    for ax, table in zip(axes[0], tables, strict=True):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        (_entropy if table == "entropy" else _erank)(ax, tables[table], colors, dashes)
        ax.set_xlabel("layer")
    handles = [Line2D([], [], color=colors[m], label=m) for m in names]
    if len(dashes) > 1:
        handles += [Line2D([], [], color="0.3", linestyle=d, label=f"{plot.length_label(n)} tokens")
                    for n, d in sorted(dashes.items())]  # fmt: skip
    types = set(pd.concat([t.layer_type for t in tables.values()])) - {"embedding"}
    if len(types) > 1 or types - {"full"}:
        handles += [Line2D([], [], marker="o", color="0.3", linestyle="", markersize=3, label="full layer"),
                    Line2D([], [], marker="o", markerfacecolor="white", markeredgecolor="0.3", linestyle="",
                           markersize=3, label="sliding layer")]  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), frameon=False)
    return fig


SPEC = Spec(
    "model_layers",
    "Attention entropy and effective rank by layer, per model",
    "figure",
    ("entropy", "erank"),
    "Left: each head's attention entropy over log of its visible keys (dots, mean over samples) and the mean "
    "over a layer's heads (line): 0 = all attention on one key, 1 = uniform. Right: effective rank of the "
    "residual stream after each block ('emb' = the embedding). A colour per model, a line style per length; "
    "filled points are full-attention layers, open ones sliding.",
    build,
    "model",
)
