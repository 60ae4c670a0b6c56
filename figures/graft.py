"""Which parts carry a checkpoint's gain (``headprobe graft``'s ``graft`` table): for each part set, the hybrid's
gain over BASE as a share of DONOR's gain, per metric."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from figures import models, style
from figures.data import MissingInput, Results
from figures.spec import Spec

METRICS = {  # the metrics drawn, with how a gain reads (higher is better, or lower)
    "needle_prefix": "needle answered (answer first)",
    "needle_accuracy": "needle answered (ROUGE-1)",
    "eval_loss": "held-out loss",
    "eval_loss_retrieval": "held-out loss, retrieval targets",
}
MIN_GAIN = {"needle_prefix": 0.05, "needle_accuracy": 0.05, "eval_loss": 0.01, "eval_loss_retrieval": 0.01}
MANY = 8  # pairs beyond which dots are grey and unlabelled


def shares(frame: pd.DataFrame) -> pd.DataFrame:
    """Per base, donor, part set, metric and length: ``share = (hybrid - base) / (donor - base)``, where the
    donor's gain over the base is at least :data:`MIN_GAIN` in size (else the pair has no share for that metric):
    1 = the part set alone carries the donor's whole gain, 0 = none of it."""
    frame = frame[frame.metric.isin(METRICS)]
    keys = ["base", "donor", "metric", "length"]
    ends = frame[frame.parts.isin(["none", "all"])].pivot_table(index=keys, columns="parts", values="value")
    ends = ends.rename(columns={"none": "base_value", "all": "donor_value"}).reset_index()
    rows = frame[~frame.parts.isin(["none", "all"])].merge(ends, on=keys)
    gain = rows.donor_value - rows.base_value
    big = gain.abs() >= rows.metric.map(MIN_GAIN)
    return rows[big].assign(share=(rows.value - rows.base_value)[big] / gain[big])


def build(results: Results) -> Figure:
    frame = results.models("graft", ["donor", "parts", "metric", "length"])
    table = shares(frame)
    if table.empty:
        raise MissingInput("no donor gained over its base by enough to share out (needle or held-out loss)")
    metrics = [m for m in METRICS if m in set(table.metric)]
    order = list(dict.fromkeys(frame.loc[~frame.parts.isin(["none", "all"]), "parts"]))
    pairs = list(dict.fromkeys(zip(table.base, table.donor, strict=True)))
    colors = models.model_colors([f"{b} → {d}" for b, d in pairs])
    fig, axes = plt.subplots(len(metrics), 1, figsize=(style.FULL_WIDTH, 1.9 * len(metrics) + 0.6), squeeze=False)
    rng = np.random.default_rng(0)
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        rows = table[table.metric == metric]
        x = {p: i for i, p in enumerate(order)}
        means = rows.groupby("parts")["share"].mean()
        ax.bar([x[p] for p in means.index], means.values, color="0.85", width=0.6, label="_mean", zorder=1)
        for (base, donor), mine in rows.groupby(["base", "donor"], sort=False):
            name = f"{base} → {donor}"
            color = colors[name] if len(pairs) <= MANY else "0.35"
            jitter = rng.uniform(-0.2, 0.2, len(mine))
            ax.scatter([x[p] + j for p, j in zip(mine.parts, jitter, strict=True)], mine.share, s=10, color=color,
                       zorder=3, label=name if len(pairs) <= MANY else "_pair")  # fmt: skip
        ax.axhline(0, color="0.5", linewidth=0.6)
        ax.axhline(1, color="0.5", linewidth=0.6, linestyle="--")
        lengths = sorted({int(n) for n in rows.length if n})
        at = f" at {', '.join(f'{n:,}' for n in lengths)} tokens" if lengths else ""
        n = rows[["base", "donor"]].drop_duplicates().shape[0]
        ax.set_title(f"{METRICS[metric]}{at}: {n} base → donor pair{'s' if n > 1 else ''}", loc="left")
        ax.set_ylabel("share of the\ndonor's gain")
        ax.set_xticks(range(len(order)), order if ax is axes[-1, 0] else [""] * len(order))
    axes[-1, 0].set_xlabel("part set grafted from the donor into the base")
    if len(pairs) <= MANY:
        fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncols=2, frameon=False)
    return fig


SPEC = Spec(
    "graft",
    "Which parts carry a checkpoint's gain (component grafting)",
    "figure",
    ("graft",),
    "For each part set grafted from DONOR into BASE (x), the hybrid's gain over BASE as a share of DONOR's "
    "whole gain (y): 1 (dashed) = those parts alone carry it, 0 = none of it, beyond 1 or below 0 = more than "
    "the whole or against it. One panel per metric whose gain is large enough to share out (needle answers, "
    "held-out loss); a dot per base → donor pair, the bar their mean.",
    build,
    "model",
)
