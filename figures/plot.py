"""Drawing helpers every figure shares: a value per member over seeds as a mean line or bar with every
seed's point visible, and the study's published values as marked stars."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from figures import style

HATCHES = ("", "///", "...", "xx", "\\\\")  # a run per hatching in grouped bars
NOTE_INCHES = 0.16  # the strip a figure's foot note takes
SEEDS_LABEL = "_seeds:"  # the label of a member's per-seed points (underscore: not in the legend)


def slot(member: int, hue: int, hues: int) -> tuple[float, float]:
    """Where the ``hue``-th of ``hues`` side-by-side columns of the ``member``-th group sits: its centre
    and width (the groups' columns together span 0.8 around the member's tick)."""
    width = 0.8 / max(hues, 1)
    return member - 0.4 + width * (hue + 0.5), width


def lines_by_run(frame: pd.DataFrame, x: str, y: str, colors: dict, xlabel: str, ylabel: str, title: str = "{run}"):
    """A panel per run (in :func:`figures.style.run_order`), in each a line per member through the seed
    means of ``y`` against ``x`` (:func:`seed_lines`), members without rows named; returns the figure
    and its panels."""
    members, runs = style.member_order(frame.member), style.run_order(frame.run)
    fig, axes = plt.subplots(1, len(runs), figsize=(style.COLUMN_WIDTH * max(1, len(runs)) * 0.7, 2.2),
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, run in zip(axes[0], runs, strict=True):
        rows = frame[frame.run == run]
        seed_lines(ax, rows, x, y, colors, members)
        ax.set_title(title.format(run=run))
        ax.set_xlabel(xlabel)
        note_missing(ax, [m for m in members if m not in set(rows.member)])
    axes[0][0].set_ylabel(ylabel)
    return fig, list(axes[0])


def seed_lines(ax: Axes, frame: pd.DataFrame, x: str, y: str, colors: dict, members: Sequence[str]) -> None:
    """One line per member through the mean over seeds of ``y`` at each ``x``; every seed's value a
    small point of the member's colour (label ``_seeds:<member>``)."""
    for member in members:
        rows = frame[frame.member == member]
        if rows.empty:
            continue
        per_seed = rows.groupby([x, "seed"], dropna=False)[y].mean().reset_index()
        mean = per_seed.groupby(x)[y].mean().sort_index()
        ax.plot(mean.index, mean.values, marker="o", color=colors[member], label=member)
        if per_seed["seed"].nunique() > 1:
            ax.scatter(per_seed[x], per_seed[y], s=6, color=colors[member], alpha=0.5, label=SEEDS_LABEL + member)


def seed_bars(
    ax: Axes, frame: pd.DataFrame, value: str, hue: str, hues: Sequence[str], members: Sequence[str], colors: dict
) -> None:
    """Grouped bars: a group per member, a bar per ``hue`` value (mean over seeds; the bar container's
    label is the hue value), every seed's value a point on its bar, ± one sd over seeds as an error bar.
    Bars of one member share its colour; hues are told apart by hatching."""
    width = slot(0, 0, len(hues))[1]
    for j, h in enumerate(hues):
        heights, errors, xs = [], [], []
        for i, member in enumerate(members):
            rows = frame[(frame.member == member) & (frame[hue] == h)]
            per_seed = rows.groupby("seed")[value].mean()
            heights.append(per_seed.mean() if len(per_seed) else np.nan)
            errors.append(per_seed.std() if len(per_seed) > 1 else 0.0)
            xs.append(slot(i, j, len(hues))[0])
            if len(per_seed) > 1:
                ax.scatter([xs[-1]] * len(per_seed), per_seed.values, s=5, color="k", zorder=3,
                           label=f"{SEEDS_LABEL}{member}:{h}")  # fmt: skip
        bars = ax.bar(xs, np.nan_to_num(heights, nan=0.0), width, yerr=errors, label=str(h),
                      color=[colors[m] for m in members], edgecolor="k", linewidth=0.4,
                      hatch=HATCHES[j % len(HATCHES)], error_kw={"lw": 0.6})  # fmt: skip
        for patch, height in zip(bars.patches, heights, strict=True):
            patch.set_gid("missing" if np.isnan(height) else "value")
    ax.set_xticks(range(len(members)), list(members), rotation=30, ha="right")


def hue_legend(ax: Axes, hues: Sequence[str], **kw) -> None:
    """A legend of :func:`seed_bars`' hues by hatching alone (members are told apart by the ticks)."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="0.85", edgecolor="k", linewidth=0.4, hatch=HATCHES[j % len(HATCHES)], label=str(h))
               for j, h in enumerate(hues)]  # fmt: skip
    handles += [c for c in ax.collections if str(c.get_label()).startswith("published")]
    ax.legend(handles=handles, frameon=False, **kw)


def length_axis(ax: Axes, lengths: Sequence[int]) -> None:
    """A log2 axis of context lengths labelled 512, 1K, 2K, ..."""
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(x) for x in lengths))
    ax.set_xticks(ticks, [length_label(t) for t in ticks])
    ax.minorticks_off()


def length_label(tokens: int) -> str:
    """A context length as figures print it: 512, 1K, 128K (``K`` only for whole multiples of 1024)."""
    tokens = int(tokens)
    return f"{tokens // 1024}K" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def published(ax: Axes, xs: Sequence[float], ys: Sequence[float], label: str = "published (the study)") -> None:
    """The study's published values as stars (one legend entry)."""
    if len(xs):
        ax.scatter(xs, ys, marker=style.PUBLISHED_MARKER, s=40, color=style.PUBLISHED_COLOR, zorder=4, label=label)


def note_diverged(fig: Figure, diverged: pd.DataFrame) -> None:
    """Say at the foot of a study figure which runs diverged (``member``, ``seed``, ``run`` rows): they are
    no architecture's number, so the figure leaves them out (or marks them, as its caption says)."""
    if diverged.empty:
        return
    runs = [f"{member} seed {seed}: {', '.join(group['run'])}" for (member, seed), group in
            diverged.groupby(["member", "seed"], sort=True)]  # fmt: skip
    height = fig.get_figheight()
    fig.set_figheight(height + NOTE_INCHES)  # a strip below the axes for the note, kept clear by the layout
    strip = NOTE_INCHES / (height + NOTE_INCHES)
    engine = fig.get_layout_engine()
    if engine is not None and hasattr(engine, "set"):
        engine.set(rect=(0, strip, 1, 1 - strip))
    fig.text(0.01, strip / 2, "diverged (no architecture's score): " + "; ".join(runs), fontsize=5, color="0.35",
             va="center")  # fmt: skip


def note_missing(ax: Axes, missing: Sequence[str], what: str = "no results") -> None:
    """Write on the axes which members have no value (a figure says what it lacks)."""
    if missing:
        ax.text(0.01, 0.99, f"{what}: " + ", ".join(missing), transform=ax.transAxes, va="top", fontsize=5,
                color="0.35")  # fmt: skip


def head_strips(
    ax: Axes, frame: pd.DataFrame, value: str, runs: Sequence[str], members: Sequence[str], colors: dict
) -> None:
    """Per-head values as points: a column per member and run (runs side by side within a member), each
    head one point (label ``<member>:<run>``), the mean over heads a short black line."""
    rng = np.random.default_rng(0)
    for i, member in enumerate(members):
        for j, run in enumerate(runs):
            rows = frame[(frame.member == member) & (frame.run == run)][value].dropna()
            if rows.empty:
                continue
            x, width = slot(i, j, len(runs))
            jitter = rng.uniform(-width * 0.3, width * 0.3, len(rows))
            ax.scatter(x + jitter, rows.values, s=4, color=colors[member], alpha=0.7, linewidths=0,
                       marker="osD^v"[j % 5], label=f"{member}:{run}")  # fmt: skip
            ax.hlines(rows.mean(), x - width * 0.4, x + width * 0.4, color="k", linewidth=0.8)
    ax.set_xticks(range(len(members)), list(members), rotation=30, ha="right")
