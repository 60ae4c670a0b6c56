"""Held-out evaluation loss against RULER-style score: does loss predict retrieval?

The loss is the run's loss on the held-out set (``study_runs.eval_loss``: fixed tokens, identical for every
member, never trained on; :mod:`headprobe.text.heldout`), beside its retrieval split
(``eval_loss_retrieval``: needle values beyond the sliding window). Never the curriculum's last training
loss (``final_curriculum_loss``), which is measured on whatever level a run reached. A diverged run is drawn
as a cross and left out of the rank correlation.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from figures import style
from figures.data import MissingInput, Results
from figures.spec import Spec

LOSSES = (
    ("eval_loss", "held-out eval loss, every target"),
    ("eval_loss_retrieval", "held-out eval loss, needle values\nbeyond the window"),
)


def pairs(results: Results) -> tuple[pd.DataFrame, str]:
    """One row per member and seed: the held-out evaluation losses of the run whose RULER-style evaluation is
    plotted (the first of cpt, sft that was evaluated), ``score`` (its mean over lengths) and ``diverged``
    (whether the run's status says so); and that run's name."""
    runs = results.runs()
    if runs.empty:
        raise MissingInput("no 'study_runs' table")
    if "eval_loss" not in runs or runs["eval_loss"].isna().all():
        raise MissingInput(
            "'study_runs' has no held-out evaluation loss (measured by `headprobe study` since issue 38)"
        )
    ruler = results.table("study_ruler", keep_diverged=True)  # drawn as crosses, left out of rho
    later = [r for r in ("cpt", "sft") if r in set(ruler.run)]
    if not later:
        raise MissingInput("needs RULER-style scores after cpt or sft")
    run = later[0]
    score = ruler[ruler.run == run].groupby(["member", "seed"])["score"].mean().reset_index()
    status = runs["status"] if "status" in runs else pd.Series(None, index=runs.index)
    losses = runs.assign(diverged=status.eq("diverged"))[runs.run == run]
    frame = losses[["member", "seed", "diverged", *(c for c, _ in LOSSES)]].merge(score, on=["member", "seed"])
    return frame, run


def build(results: Results) -> Figure:
    frame, run = pairs(results)
    colors = style.member_colors(results.members())
    fig, axes = plt.subplots(1, len(LOSSES), figsize=(style.FULL_WIDTH, 2.4), sharey=True)
    for ax, (column, label) in zip(axes, LOSSES, strict=True):
        for member in style.member_order(frame.member):
            rows = frame[frame.member == member]
            ok, bad = rows[~rows.diverged], rows[rows.diverged]
            if len(ok):  # a member whose every run diverged has no dot (nor an empty legend entry)
                ax.scatter(ok[column], ok.score, color=colors[member], s=14, label=member, edgecolor="k", linewidth=0.3)
            if len(bad):
                ax.scatter(bad[column], bad.score, color=colors[member], s=18, marker="x", label=f"{member} (diverged)")
        trained = frame[~frame.diverged].dropna(subset=[column])
        if len(trained) >= 3:
            rho = trained[[column, "score"]].corr(method="spearman").iloc[0, 1]
            ax.set_title(f"Spearman rho = {rho:.2f} over {len(trained)} trained runs")
        ax.set_xlabel(f"{label} after {run}\n(nats per target token)")
    axes[0].set_ylabel(f"RULER-style score after {run}")
    axes[0].legend(frameon=False, fontsize=5)
    return fig


SPEC = Spec(
    "loss_vs_retrieval",
    "Held-out loss does not predict retrieval",
    "figure",
    ("study_runs", "study_ruler"),
    "Each point a member and seed, its held-out evaluation loss (left: every target; right: needle values "
    "beyond the window) against its RULER-style score after the same run; if loss predicted retrieval the "
    "points would fall on a line from top left to bottom right. Crosses: diverged runs, left out of rho.",
    build,
)
