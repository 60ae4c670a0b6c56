"""RULER-style score by context length, a line per member, a panel per run (the study's per-length figure)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import Results
from figures.spec import Spec


def build(results: Results) -> Figure:
    frame = results.table("study_ruler")
    colors = style.member_colors(results.members())
    members = style.member_order(frame.member)
    runs = style.run_order(frame.run)
    fig, axes = plt.subplots(1, len(runs), figsize=(style.COLUMN_WIDTH * max(1, len(runs)) * 0.7, 2.2),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, run in zip(axes[0], runs, strict=True):
        rows = frame[frame.run == run]
        plot.seed_lines(ax, rows, "length", "score", colors, members)
        plot.length_axis(ax, frame.length)
        ax.set_title(f"after {run}")
        ax.set_xlabel("context length (tokens)")
        plot.note_missing(ax, [m for m in members if m not in set(rows.member)])
    axes[0][0].set_ylabel("RULER-style score (0-100)")
    axes[0][0].set_ylim(-2, 102)
    axes[0][-1].legend(loc="upper right", frameon=False)
    return fig


SPEC = Spec(
    "ruler_by_length",
    "RULER-style score by context length",
    "figure",
    ("study_ruler", "study_runs"),
    "Mean over tasks at each length, a line per member (mean over seeds, each seed a dot); higher is better, "
    "and the gap between members at the longest length is the study's claim.",
    build,
)
