"""RULER-style score of any model by task and length (``headprobe ruler eval``'s ``ruler_scores``, or its
``ruler_samples`` where only those are there): a task x length grid of scores per model."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from figures import models, plot
from figures.data import MissingInput, Results
from figures.spec import Spec

CMAP = "YlGnBu"
MEAN = "mean over tasks"
# RULER's own order of its 13 tasks (headprobe.evals.ruler.tasks); any other task after them by name
ORDER = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")  # fmt: skip


def task_order(tasks) -> list[str]:
    """Tasks in the order figures list them: the needle (headprobe's own), RULER's in RULER's order, others
    by name."""
    present = {str(t) for t in tasks}
    known = ("needle", *ORDER)
    return [t for t in known if t in present] + sorted(present - set(known))


def scores(results: Results) -> pd.DataFrame:
    """One row per model x task x length: ``score`` (0-100), ``n`` samples; the mean over tasks as task
    :data:`MEAN` (``partial`` where some task asked for was not scored at that length). From
    ``ruler_scores``, else computed from ``ruler_samples`` (the mean of its per-sample scores)."""
    try:
        table = results.models("ruler_scores", ["scope", "task", "length"])
    except MissingInput as err:
        try:
            samples = results.models("ruler_samples", ["task", "length", "sample"])
        except MissingInput:
            raise MissingInput(f"{err}, nor a 'ruler_samples' table") from None
        cells = samples.groupby(["model", "task", "length"])["score"].agg(["mean", "size"]).reset_index()
        cells = cells.rename(columns={"mean": "score", "size": "n"})
        mean = cells.groupby(["model", "length"])["score"].mean().reset_index().assign(task=MEAN, n=np.nan)
        return pd.concat([cells.assign(partial=False), mean.assign(partial=False)], ignore_index=True)
    cells = table[table.scope == "task"][["model", "task", "length", "score", "n"]].assign(partial=False)
    mean = table[table.scope == "length"]
    n_tasks = mean["n_tasks"] if "n_tasks" in mean else mean["n"]
    mean = mean.assign(task=MEAN, partial=(mean["n"] < n_tasks.fillna(mean["n"])).to_numpy(bool))
    rows = pd.concat([cells, mean[["model", "task", "length", "score", "n", "partial"]]], ignore_index=True)
    return rows.assign(length=rows["length"].astype(int))


def _panel(
    ax, model: str, rows: pd.DataFrame, tasks: list[str], lengths: list[int], norm: Normalize, first: bool
) -> int:
    """Draw one model's grid; returns how many of its cells have no score."""
    grid = rows.pivot_table(index="task", columns="length", values="score", aggfunc="mean")
    grid = grid.reindex(index=[*tasks, MEAN], columns=lengths)
    values = grid.to_numpy(float)
    image = ax.imshow(np.ma.masked_invalid(values), cmap=CMAP, norm=norm, aspect="auto", interpolation="nearest")
    image.set_gid(f"scores:{model}")
    ax.set_facecolor("0.93")
    ax.grid(False)
    partial = set(rows[(rows.task == MEAN) & rows.partial].length)
    for i, task in enumerate(grid.index):
        for j, length in enumerate(lengths):
            v = values[i, j]
            if np.isnan(v):
                ax.text(j, i, "–", ha="center", va="center", fontsize=5, color="0.45")
                continue
            dark = norm(v) > 0.55
            mean = task == MEAN
            text = f"{v:.1f}{'*' if length in partial else ''}" if mean else f"{v:.0f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=5, color="white" if dark else "black",
                    weight="bold" if mean else "normal")  # fmt: skip
    ax.axhline(len(tasks) - 0.5, color="k", linewidth=0.8)  # the mean row below the tasks
    ax.set_xticks(range(len(lengths)), [plot.length_label(n) for n in lengths])
    ax.set_yticks(range(len(grid.index)), list(grid.index))
    ax.tick_params(length=0, labelleft=first)
    counts = rows[rows.task != MEAN]["n"].dropna().astype(int)
    n = "" if counts.empty else f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()}-{counts.max()}"
    ax.set_title(f"{model}\n{n} samples per cell" if n else model, fontsize=6)
    return int(np.isnan(values).sum())


def build(results: Results) -> Figure:
    rows = scores(results)
    if rows.empty:
        raise MissingInput("the RULER-style tables hold no score")
    names = models.model_order(rows.model)
    tasks = task_order(rows[rows.task != MEAN].task)
    lengths = sorted(set(rows.length.astype(int)))
    norm = Normalize(0, 100)
    width = 1.3 + len(names) * (0.36 * len(lengths) + 0.35)
    fig, axes = plt.subplots(1, len(names), figsize=(max(width, 3.0), 0.55 + 0.16 * (len(tasks) + 1) + 0.6),
                             squeeze=False)  # fmt: skip
    blank = sum(_panel(ax, model, rows[rows.model == model], tasks, lengths, norm, i == 0)
                for i, (ax, model) in enumerate(zip(axes[0], names, strict=True)))  # fmt: skip
    bar = fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=CMAP), ax=axes[0].tolist(), fraction=0.05, pad=0.02)
    bar.set_label("RULER-style score (0-100)")
    notes = ["–: not evaluated at that length"] if blank else []
    if rows[rows.task == MEAN].partial.any():
        notes.append("*: mean over the tasks scored there (some were too long for the length)")
    fig.supxlabel("\n".join(["context length (tokens)", *(["; ".join(notes)] if notes else [])]), fontsize=6,
                  linespacing=1.6)  # fmt: skip
    return fig


SPEC = Spec(
    "model_ruler",
    "RULER-style score by task and length, per model",
    "figure",
    ("ruler_scores", "ruler_samples"),
    "A panel per model: each task's RULER-style score (0-100, higher is better) at each evaluated length, "
    "and below the line their mean over tasks (RULER's per-length score); read across a row to see a task "
    "fade with length, down a column to see which tasks a model can do at all.",
    build,
    "model",
)
