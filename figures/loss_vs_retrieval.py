"""Final pretraining loss against RULER-style score: does loss predict retrieval?"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import style
from figures.data import MissingInput, Results
from figures.spec import Spec


def pairs(results: Results):
    """One row per member and seed: ``final_loss`` of its pt run, ``score`` (mean over lengths) of its
    RULER-style evaluation after the latest of cpt, sft that was evaluated; and that run's name."""
    runs = results.runs()
    ruler = results.table("study_ruler")
    if runs.empty:
        raise MissingInput("no 'study_runs' table")
    loss = runs[runs.run == "pt"][["member", "seed", "final_loss"]]
    later = [r for r in ("cpt", "sft") if r in set(ruler.run)]
    if loss.empty or not later:
        raise MissingInput("needs pt runs and RULER-style scores after cpt or sft")
    run = later[0]
    score = ruler[ruler.run == run].groupby(["member", "seed"])["score"].mean().reset_index()
    return loss.merge(score, on=["member", "seed"]), run


def build(results: Results) -> Figure:
    frame, run = pairs(results)
    colors = style.member_colors(results.members())
    fig, ax = plt.subplots(figsize=(style.COLUMN_WIDTH, 2.4))
    for member in style.member_order(frame.member):
        rows = frame[frame.member == member]
        ax.scatter(rows.final_loss, rows.score, color=colors[member], s=14, label=member, edgecolor="k", linewidth=0.3)
    if len(frame) >= 3:
        rho = frame[["final_loss", "score"]].corr(method="spearman").iloc[0, 1]
        ax.set_title(f"Spearman rho = {rho:.2f} over {len(frame)} runs")
    ax.set_xlabel("final pt training loss (nats per target token)")
    ax.set_ylabel(f"RULER-style score after {run}")
    ax.legend(frameon=False, fontsize=5)
    return fig


SPEC = Spec(
    "loss_vs_retrieval",
    "Training loss does not predict retrieval",
    "figure",
    ("study_runs", "study_ruler"),
    "Each point a member and seed; if loss predicted retrieval the points would fall on a line from top "
    "left to bottom right.",
    build,
)
