"""Residual-stream effective rank per layer, a line per member, a panel per run."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import Results
from figures.spec import Spec


def build(results: Results) -> Figure:
    frame = results.table("erank")
    frame = frame.groupby(["member", "seed", "run", "layer"])["value"].mean().reset_index()  # over lengths
    colors = style.member_colors(results.members())
    members = style.member_order(frame.member)
    runs = style.run_order(frame.run)
    fig, axes = plt.subplots(1, len(runs), figsize=(style.COLUMN_WIDTH * max(1, len(runs)) * 0.7, 2.2),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, run in zip(axes[0], runs, strict=True):
        rows = frame[frame.run == run]
        plot.seed_lines(ax, rows, "layer", "value", colors, members)
        ax.set_title(run)
        ax.set_xlabel("layer (-1 = embedding)")
        plot.note_missing(ax, [m for m in members if m not in set(rows.member)])
    axes[0][0].set_ylabel("effective rank (Roy & Vetterli)")
    axes[0][-1].legend(frameon=False)
    return fig


SPEC = Spec(
    "effective_rank",
    "Residual-stream effective rank by layer",
    "figure",
    ("erank", "study_runs"),
    "Effective rank (exp of the entropy of the normalised singular values, uncentred) of the residual "
    "stream after each block; the study reads wider heads as keeping a higher-rank stream.",
    build,
)
