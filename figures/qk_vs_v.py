"""Does query/key width or value width carry retrieval? The asymmetric members beside the symmetric ones."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from figures import plot, style
from figures.data import MissingInput, Results
from figures.spec import Spec


def _panel(ax, values, members, colors, title):
    """A bar per member (mean over seeds) and every seed's value a dot."""
    for i, member in enumerate(members):
        per_seed = values[values.member == member]
        ax.bar(i, per_seed.v.mean(), 0.7, color=colors[member], edgecolor="k", linewidth=0.4, label=member)
        if len(per_seed) > 1:
            ax.scatter([i] * len(per_seed), per_seed.v, s=5, color="k", zorder=3, label="_seeds:" + member)
    ax.set_xticks(range(len(members)), [str(style.shape(m).label) for m in members], rotation=30, ha="right")
    ax.set_title(title)
    plot.note_missing(ax, [m for m in members if values[values.member == m].v.isna().all()], "no score")


def _optional(results: Results, table: str) -> pd.DataFrame:
    """``table`` without its diverged runs (:meth:`Results.table`), or an empty frame: each panel is optional."""
    try:
        return results.table(table)
    except MissingInput:
        return pd.DataFrame()


def build(results: Results) -> Figure:
    colors = style.member_colors(results.members())
    panels = []
    ruler = _optional(results, "study_ruler")
    if not ruler.empty:
        run = next((r for r in ("cpt", "sft") if r in set(ruler.run)), None)
        if run:
            v = ruler[ruler.run == run].groupby(["member", "seed"])["score"].mean().rename("v").reset_index()
            panels.append((v, f"RULER-style score after {run}"))
    heads = _optional(results, "study_heads")
    if not heads.empty and "member" in heads:
        rows = heads[(heads.layer_type == "full") & (heads.run == "cpt")]
        if not rows.empty:
            v = rows.groupby(["member", "seed"])["fraction"].mean().rename("v").reset_index()
            panels.append((v, "retrieval-head share, full layers, after cpt"))
    if not panels:
        raise MissingInput("needs study_ruler or study_heads")
    members = [m for m in style.member_order(results.members()) if style.shape(m) is not None]
    fig, axes = plt.subplots(1, len(panels), figsize=(style.COLUMN_WIDTH * len(panels) * 0.8, 2.3), squeeze=False)
    for ax, (values, title) in zip(axes[0], panels, strict=True):
        _panel(ax, values, [m for m in members if m in set(values.member)], colors, title)
    fig.suptitle("blue: qk = v; orange: wider query/key; green: wider value", fontsize=6)
    return fig


SPEC = Spec(
    "qk_vs_v",
    "Query/key width against value width",
    "figure",
    ("study_ruler", "study_heads"),
    "At a fixed budget, compare the orange bar (wide query/key) and the green one (wide value) with the "
    "symmetric blues: the study found query/key width carries retrieval.",
    build,
)
