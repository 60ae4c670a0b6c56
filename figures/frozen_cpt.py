"""The frozen-projection experiment: RULER-style score after cpt with attention trained vs frozen, beside the
score before cpt (pt) when it was measured, so each cpt's gain shows."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import MissingInput, Results
from figures.spec import Spec

RUNS = ("pt", "cpt", "cpt-frozen")  # pt: the score before either cpt (drawn when measured)


def build(results: Results) -> Figure:
    frame = results.table("study_ruler")
    frame = frame[frame.run.isin(RUNS)]
    if not {"cpt", "cpt-frozen"} <= set(frame.run):
        raise MissingInput("needs RULER-style scores of both cpt and cpt-frozen runs")
    runs = [r for r in RUNS if r in set(frame.run)]
    colors = style.member_colors(results.members())
    members = style.member_order(frame.member)
    fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH, 2.3))
    plot.seed_bars(ax, frame, "score", "run", runs, members, colors)
    ax.set_ylabel("RULER-style score (0-100, mean over lengths)")
    ax.set_title("cpt with attention trained vs frozen")
    plot.hue_legend(ax, runs, loc="upper left")
    return fig


SPEC = Spec(
    "frozen_cpt",
    "Continual pretraining with attention trained vs frozen",
    "figure",
    ("study_ruler", "study_runs"),
    "A member whose score drops when its attention projections are frozen during cpt needed to retrain "
    "attention for long context; a small drop means the head shape it had already carried retrieval. "
    "The pt bar, when measured, is the score before either cpt.",
    build,
)
