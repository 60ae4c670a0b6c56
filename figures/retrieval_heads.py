"""Retrieval heads before and after cpt: the share of heads scoring >= 0.1, a bar per run per member."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import plot, published, style
from figures.data import Results
from figures.spec import Spec

LAYER_TYPES = ("full", "all")


def build(results: Results) -> Figure:
    frame = results.table("study_heads")
    colors = style.member_colors(results.members())
    members = style.member_order(frame.member)
    runs = style.run_order(frame.run)
    reference = published.lookup("retrieval_head_fraction")
    fig, axes = plt.subplots(1, len(LAYER_TYPES), figsize=(style.FULL_WIDTH * 0.8, 2.3), sharey=True, squeeze=False)
    for ax, layer_type in zip(axes[0], LAYER_TYPES, strict=True):
        rows = frame[frame.layer_type == layer_type]
        plot.seed_bars(ax, rows, "fraction", "run", runs, members, colors)
        ax.set_title(f"{layer_type} layers" if layer_type != "all" else "all layers")
        missing = sorted({m for m in members if rows[rows.member == m]["fraction"].isna().all()})
        plot.note_missing(ax, missing, "no kept needle sample (no score)")
        if layer_type == "all" and "cpt" in runs:  # the study's fractions are after cpt, over all heads
            xs = [plot.slot(i, runs.index("cpt"), len(runs))[0] for i, m in enumerate(members) if m in reference]
            plot.published(ax, xs, [reference[m] for m in members if m in reference])
    axes[0][0].set_ylabel("retrieval heads (share of heads)")
    plot.hue_legend(axes[0][-1], runs, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    return fig


SPEC = Spec(
    "retrieval_heads",
    "Retrieval heads before and after continual pretraining",
    "figure",
    ("study_heads", "study_runs"),
    "Share of heads with retrieval score >= 0.1 (Wu et al.'s code's count, copies / span), a bar per run "
    "(hatched by run), per member; "
    "full-attention layers and all layers; stars are the study's published after-cpt shares.",
    build,
)
