"""RULER-style score by context length, a line per member, a panel per run (the study's per-length figure)."""

from __future__ import annotations

from matplotlib.figure import Figure

from figures import plot, style
from figures.data import Results
from figures.spec import Spec


def build(results: Results) -> Figure:
    frame = results.table("study_ruler")
    colors = style.member_colors(results.members())
    fig, axes = plot.lines_by_run(frame, "length", "score", colors, "context length (tokens)",
                                  "RULER-style score (0-100)", title="after {run}")  # fmt: skip
    for ax in axes:
        plot.length_axis(ax, frame.length)
    axes[0].set_ylim(-2, 102)
    axes[-1].legend(loc="upper right", frameon=False)
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
