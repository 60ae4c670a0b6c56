"""Held-out task probes (toy scale): share answered exactly by distance, a panel per task and run."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import Results
from figures.spec import Spec


def build(results: Results) -> Figure:
    frame = results.table("study_probes")
    colors = style.member_colors(results.members())
    members = style.member_order(frame.member)
    runs, tasks = style.run_order(frame.run), sorted(set(frame.task))
    fig, axes = plt.subplots(len(runs), len(tasks), figsize=(2.0 * len(tasks) + 0.6, 1.7 * len(runs) + 0.4),
                             sharey=True, squeeze=False)  # fmt: skip
    for r, run in enumerate(runs):
        for t, task in enumerate(tasks):
            ax = axes[r][t]
            rows = frame[(frame.run == run) & (frame.task == task)]
            plot.seed_lines(ax, rows.assign(accuracy=rows.accuracy * 100), "distance", "accuracy", colors, members)
            ax.set_title(f"{task}, after {run}")
            ax.set_ylim(-3, 103)
            ax.set_xticks(sorted(set(rows.distance)))  # the probed distances only (one alone gets no 480-520 axis)
            if r == len(runs) - 1:
                ax.set_xlabel("distance (characters)")
        axes[r][0].set_ylabel("answered exactly (%)")
    axes[0][-1].legend(frameon=False, fontsize=5)
    return fig


SPEC = Spec(
    "probes",
    "Held-out retrieval probes by distance",
    "figure",
    ("study_probes",),
    "Greedy answers to held-out needles, recall and copy tasks at distances beyond every sliding window; "
    "the toy-scale counterpart of RULER.",
    build,
)
