"""Head ablation: accuracy with chosen heads knocked out against the intact model, by context length
(``headprobe ablate``'s ``ablation`` table: a row per model x condition x heads x seed x task x length x depth).

Conditions: ``baseline`` (nothing ablated), ``top`` (the model's highest-scoring retrieval heads),
``random`` (as many heads drawn at random, once per seed) and ``heads`` (a set named by hand); each
ablated by ``zero`` or ``mean``. Depths are pooled weighting each by its samples (``n``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib as mpl
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures import models, plot
from figures.data import MissingInput, Results
from figures.model_ruler import task_order
from figures.spec import Spec

CONDITIONS = ("baseline", "top", "heads", "random")  # the order of the legend
PALETTES = {"top": "Reds", "heads": "Purples", "random": "Blues"}
KEYS = ["condition", "mode", "heads", "n_heads", "seed", "task", "length", "depth"]
PER_ROW = 4


@dataclass(frozen=True)
class Series:
    """One line of a panel: a condition, how its heads were ablated, which (or how many) heads."""

    condition: str
    mode: str
    n_heads: int
    heads: str

    @property
    def label(self) -> str:
        if self.condition == "baseline":
            return "baseline (nothing ablated)"
        if self.condition == "heads":
            named = self.heads if len(self.heads) <= 24 else self.heads[:22] + "…"
            return f"heads {named} ({self.mode})"
        return f"{self.condition} {self.n_heads} ({self.mode})"


def pooled(frame: pd.DataFrame) -> pd.DataFrame:
    """Accuracy pooled over depths, each depth weighted by its samples ``n``: a row per model x series x
    seed x task x length, with ``n`` summed."""
    frame = frame.assign(heads=frame["heads"].fillna("").astype(str), mode=frame["mode"].fillna("none"))
    keys = ["model", "condition", "mode", "n_heads", "heads", "seed", "task", "length"]
    return models.weighted_mean(frame, keys, "accuracy", "n")


def series_of(rows: pd.DataFrame) -> list[Series]:
    """The lines of a panel in legend order: baseline, top, heads, random; by mode, then heads ablated.
    Random sets of one size are one line whatever heads each seed drew."""
    found = set()
    for r in rows.itertuples():
        heads = r.heads if r.condition == "heads" else ""
        found.add(Series(str(r.condition), str(r.mode), int(r.n_heads), heads))

    def key(s: Series) -> tuple:
        rank = CONDITIONS.index(s.condition) if s.condition in CONDITIONS else len(CONDITIONS)
        return (rank, s.condition, s.mode, s.n_heads, s.heads)

    return sorted(found, key=key)


def series_rows(rows: pd.DataFrame, s: Series) -> pd.DataFrame:
    picked = (rows.condition == s.condition) & (rows["mode"] == s.mode) & (rows.n_heads == s.n_heads)
    if s.condition == "heads":
        picked &= rows["heads"] == s.heads
    return rows[picked]


def colors_of(series: list[Series]) -> dict[Series, tuple]:
    """Baseline black; each other condition its own hue (top red, hand-named purple, random blue), darker
    the more heads it ablates."""
    out: dict[Series, tuple] = {}
    for condition in {s.condition for s in series}:
        family = sorted({(s.n_heads, s.heads) for s in series if s.condition == condition})
        if condition == "baseline":
            out |= {s: mpl.colors.to_rgba("k") for s in series if s.condition == condition}
            continue
        cmap = mpl.colormaps[PALETTES.get(condition, "Blues")]
        for s in series:
            if s.condition == condition:
                i = family.index((s.n_heads, s.heads))
                out[s] = cmap(0.55 + 0.4 * (i + 1) / (len(family) + 1) if len(family) > 1 else 0.75)
    return out


DODGE = 0.07  # log2 units between neighbouring series at one length, so that no point hides another


def _panel(ax: Axes, rows: pd.DataFrame, series: list[Series], colors: dict) -> None:
    for i, s in enumerate(series):
        part = series_rows(rows, s)
        if part.empty:
            continue
        # each series a little to the side of the length it was measured at (the tick marks the length)
        part = part.assign(length=part["length"] * 2 ** (DODGE * (i - (len(series) - 1) / 2)))
        dash = "--" if s.mode == "mean" else "-"
        if s.condition == "random":
            by_length = part.groupby("length")["accuracy"]
            mean, low, high = by_length.mean(), by_length.min(), by_length.max()
            seeds = part["seed"].nunique()
            ax.fill_between(mean.index, low.values, high.values, color=colors[s], alpha=0.18, linewidth=0,
                            label=f"_band:{s.label}")  # fmt: skip
            ax.vlines(mean.index, low.values, high.values, color=colors[s], linewidth=0.8,
                      label=f"_range:{s.label}")  # fmt: skip
            ax.scatter(part["length"], part["accuracy"], s=3, color=colors[s], alpha=0.6, linewidths=0,
                       label=f"_seeds:{s.label}")  # fmt: skip
            ax.plot(mean.index, mean.values, color=colors[s], linestyle=dash, marker="o",
                    label=f"{s.label}: mean, min-max over {seeds} seed{'s' if seeds > 1 else ''}")  # fmt: skip
        else:
            line = part.groupby("length")["accuracy"].mean()  # one row per length already
            ax.plot(line.index, line.values, color=colors[s], linestyle=dash, marker="o", label=s.label,
                    zorder=3 if s.condition == "baseline" else 2)  # fmt: skip


def build(results: Results) -> Figure:
    frame = results.models("ablation", KEYS)
    rows = pooled(frame)
    if rows.empty:
        raise MissingInput("the 'ablation' tables hold no row")
    names = models.model_order(rows.model)
    # a row of panels per model (wrapped after PER_ROW tasks), its tasks in RULER's order after the needle
    per_model = {m: task_order(set(rows[rows.model == m].task)) for m in names}
    n_cols = min(PER_ROW, max(len(t) for t in per_model.values()))
    places, row = {}, 0
    for model, tasks in per_model.items():
        places |= {(model, task): (row + i // n_cols, i % n_cols) for i, task in enumerate(tasks)}
        row += math.ceil(len(tasks) / n_cols)
    n_rows = row
    series = series_of(rows)
    colors = colors_of(series)
    size = (0.6 + 2.1 * n_cols, 0.7 + 1.75 * n_rows)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=size, sharex=True, sharey=True, squeeze=False)
    lengths = sorted(set(rows.length.astype(int)))
    for (model, task), (r, c) in places.items():
        ax = axes[r][c]
        panel = rows[(rows.model == model) & (rows.task == task)]
        _panel(ax, panel, series, colors)
        plot.length_axis(ax, lengths)
        if len(lengths) == 1:  # room for the dodged series either side of the one length
            ax.set_xlim(lengths[0] / 2 ** (0.6 + DODGE * len(series)), lengths[0] * 2 ** (0.6 + DODGE * len(series)))
        ax.set_ylim(-0.03, 1.03)
        low, high = int(panel.n.min()), int(panel.n.max())  # prompts behind each point (a seed's, for random)
        n = f"{low}" if low == high else f"{low}-{high}"
        name = f"{model} · {task}" if len(names) > 1 else task
        ax.set_title(f"{name}\n{n} prompt{'s' if high > 1 else ''} per point", linespacing=1.4)
        ax.set_gid(f"{model}:{task}")
    used = set(places.values())
    for r in range(n_rows):
        for c in range(n_cols):
            if (r, c) not in used:
                axes[r][c].set_visible(False)
        axes[r][0].set_ylabel("accuracy")
    for c in range(n_cols):  # the lowest panel of each column gets the length labels, even above an empty slot
        bottom = max((r for r, cc in used if cc == c), default=None)
        if bottom is not None:
            axes[bottom][c].set_xlabel("context length (tokens)")
            axes[bottom][c].tick_params(labelbottom=True)
    handles = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if not str(line.get_label()).startswith("_"):
                handles.setdefault(line.get_label(), line)
    title = f"{names[0]}: accuracy with heads ablated" if len(names) == 1 else "accuracy with heads ablated"
    dashed = "; dashed: mean-ablated" if any(s.mode == "mean" for s in series) else ""
    fig.suptitle(f"{title} (depths pooled, weighted by samples{dashed})", fontsize=7)
    fig.legend(handles=list(handles.values()), loc="outside lower center", ncols=min(2, len(handles)),
               frameon=False)  # fmt: skip
    return fig


SPEC = Spec(
    "ablation",
    "Accuracy with heads ablated, per model and task",
    "figure",
    ("ablation",),
    "A panel per model and task, accuracy by context length: black the intact model, red its top retrieval "
    "heads ablated, purple heads named by hand, blue as many heads drawn at random (line: mean over seeds, "
    "band and bars: min to max, dots: each seed); solid = zeroed, dashed = mean-ablated. Top far below "
    "random means those heads carry the retrieval.",
    build,
    "model",
)
