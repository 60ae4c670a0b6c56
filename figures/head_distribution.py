"""Shared by the per-head figures (entropy, reordering): per-head values of the full-attention layers
per member, runs side by side; one module draws each quantity."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from figures import plot, style
from figures.data import MissingInput, Results


def per_head(results: Results, table: str, value: str, ylabel: str, title: str) -> Figure:
    """``value`` of ``table`` averaged per head over samples and lengths (full-attention layers), drawn
    with :func:`figures.plot.head_strips`."""
    frame = results.table(table)
    frame = frame[frame.layer_type == "full"]
    if frame.empty:
        raise MissingInput(f"{table!r} holds no full-attention heads")
    heads = frame.groupby(["member", "seed", "run", "layer", "head"])[value].mean().reset_index()
    colors = style.member_colors(results.members())
    members = style.member_order(heads.member)
    runs = style.run_order(heads.run)
    fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH * 1.2, 2.3))
    plot.head_strips(ax, heads, value, runs, members, colors)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles = [Line2D([], [], marker="osD^v"[j % 5], color="0.3", linestyle="", label=r) for j, r in enumerate(runs)]
    # beside the axes: inside, it sat on the last member's heads
    ax.legend(handles=handles, frameon=False, title="run", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
