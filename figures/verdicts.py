"""The study's findings answered: a panel per finding, our value with its 95% bootstrap interval over seeds
beside the study's published value where it gives one, the verdict written on the panel
(:mod:`headprobe.study.verdicts`)."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import MissingInput, Results
from figures.spec import Spec
from headprobe.study.verdicts import ANALYSIS_TABLES, HOLDS, OPPOSITE, RHO_MARGIN, STUDY_TABLES, verdicts

COLORS = {HOLDS: "#1a7f37", OPPOSITE: "#cf222e"}  # inconclusive: grey
BANDS = {2: RHO_MARGIN}  # findings decided by a band around 0, not by the sign


def frame_of(results: Results) -> pd.DataFrame:
    """The verdict table of a study's results folder (computed from its tables, as ``headprobe study`` does)."""
    if results.runs().empty:
        raise MissingInput("no 'study_runs' table (`headprobe study` writes it)")
    return verdicts({t: results.raw(t) for t in STUDY_TABLES}, {t: results.raw(t) for t in ANALYSIS_TABLES})


def _panel(ax: Axes, row: pd.Series) -> None:
    """Our value with its interval at x = 0, the published value (a star) at x = 1, the rule's line or band,
    and the verdict with the start of its reason."""
    ax.axhline(0.0, color="0.6", linewidth=0.6)
    if row.finding in BANDS:
        ax.axhspan(-BANDS[row.finding], BANDS[row.finding], color="0.92", zorder=0)
    color = COLORS.get(row.verdict, "0.45")
    if not pd.isna(row.value):
        low, high = row.ci_low, row.ci_high
        err = None if pd.isna(low) else [[row.value - low], [high - row.value]]
        ax.errorbar([0], [row.value], yerr=err, fmt="o", color=color, capsize=3, markersize=4, label="ours")
    if pd.isna(row.published):
        ax.text(1, 0.5, "no number", transform=ax.get_xaxis_transform(), ha="center", fontsize=4.5, color="0.45")
    else:
        plot.published(ax, [1], [row.published])
        ax.annotate(row.published_scale.upper(), (1, row.published), xytext=(5, -2), textcoords="offset points",
                    fontsize=4.5, color="0.35")  # fmt: skip
    ax.set_xlim(-0.7, 1.7)
    ax.set_xticks([0, 1], ["ours", "published"])
    ax.set_ylabel(row.unit, fontsize=5)
    ax.set_title(textwrap.fill(f"{row.finding}. {row.title}", 34), fontsize=5.5)
    clauses = str(row.reason).split("; ")
    first = "; ".join(clauses[: 1 if row.verdict in COLORS else 2])  # inconclusive: the cause and what was left out
    ax.text(0.03, 0.97, row.verdict.upper(), transform=ax.transAxes, va="top", fontsize=7, color=color,
            fontweight="bold")  # fmt: skip
    said = textwrap.fill(textwrap.shorten(first, 118, placeholder=" ..."), 40)  # three lines at most
    ax.text(0.03, 0.84, said, transform=ax.transAxes, va="top", fontsize=4, color="0.3")
    _room(ax, row)


def _room(ax: Axes, row: pd.Series) -> None:
    """Y limits that hold the value, its interval, the published value and 0, with headroom for the text."""
    ys = [v for v in (0.0, row.value, row.ci_low, row.ci_high, row.published) if not pd.isna(v)]
    if row.finding in BANDS:
        ys += [-BANDS[row.finding], BANDS[row.finding]]
    low, high = min(ys), max(ys)
    span = (high - low) or 1.0
    ax.set_ylim(low - 0.15 * span, high + 0.9 * span)


def build(results: Results) -> Figure:
    frame = frame_of(results)
    fig, axes = plt.subplots(2, 4, figsize=(style.FULL_WIDTH, 3.6))
    for ax, (_, row) in zip(np.ravel(axes), frame.iterrows(), strict=True):
        _panel(ax, row)
    fig.suptitle("The study's findings: our value [95% interval over seeds] beside the study's (stars)", fontsize=7)
    return fig


SPEC = Spec(
    "verdicts",
    "The study's findings: verdicts",
    "figure",
    ("study_runs", "study_probes", "study_heads", "entropy", "reordering", "erank"),
    "One panel per finding: our value (dot) with its 95% bootstrap interval over seeds, the study's published "
    "value (star, labelled with its scale: beside toys, the study's direction on its own measure) where it gives "
    "one, the verdict (holds, opposite, inconclusive) and the start of its reason; the grey band of finding 2 is "
    "|rho| < 0.5 (docs/study.md, Verdicts).",
    build,
)
