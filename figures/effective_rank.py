"""Residual-stream effective rank per layer, a line per member, a panel per run."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from figures import plot, style
from figures.data import Results
from figures.spec import Spec


def build(results: Results) -> Figure:
    frame = results.table("erank")
    frame = frame.groupby(["member", "seed", "run", "layer"])["value"].mean().reset_index()  # over lengths
    colors = style.member_colors(results.members())
    fig, axes = plot.lines_by_run(frame, "layer", "value", colors, "layer (-1 = embedding)",
                                  "effective rank (Roy & Vetterli)")  # fmt: skip
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
    axes[-1].legend(frameon=False)
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
