"""Retrieval heads across training (``headprobe analyze RUN --steps ...``): per run, every head's attention on the
needle with the answer forced, over the run's step checkpoints (heads x steps), and the count of retrieval heads
over steps beside the run's own task probes (its ``metrics.jsonl``) on the same step axis."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from figures import models
from figures.data import MissingInput, Results
from figures.spec import Spec

STEP_SUFFIX = re.compile(r"-step_\d+$")  # a step checkpoint's results name: <run>-step_000100
COUNTS = {  # analysis_summary statistics drawn as counts, and their labels
    "forced_retrieval_heads": "retrieval heads (answer forced)",
    "reading_heads": "needle-reading heads",
    "retrieval_heads": "retrieval heads (Wu, answered)",
}
CMAP = "viridis"
VALUE = "forced_mass"  # the heatmap's column of the retrieval table: defined at every step, answering or not


def run_of(model: str) -> str:
    """The run a step checkpoint's results name belongs to: ``toy-d64-s0-pt-step_000100`` -> ``toy-d64-s0-pt``."""
    return STEP_SUFFIX.sub("", model)


def step_rows(results: Results, table: str) -> pd.DataFrame:
    """The rows of ``table`` measured on step checkpoints (those with a ``step``), each with its ``run``."""
    frame = results.models(table, steps=True)
    if "step" not in frame.columns or frame["step"].isna().all():
        raise MissingInput(f"no {table!r} rows of step checkpoints: analyse a run's steps with `headprobe analyze RUN "
                           "--steps all`")  # fmt: skip
    frame = frame[frame["step"].notna()].copy()
    frame["step"] = frame["step"].astype(int)
    return frame.assign(run=frame["model"].map(run_of))


def probe_log(results: Results) -> dict[str, pd.DataFrame]:
    """Per run, the task probes its ``metrics.jsonl`` logged (``step`` and one accuracy column per probe,
    ``probe/needle@500``), found beside the step checkpoints the tables were measured on; runs whose log is not
    there are absent."""
    logs: dict[str, pd.DataFrame] = {}
    for _, meta in results.sources(["retrieval"]):
        if not meta.model or not meta.checkpoint or run_of(meta.model) in logs:
            continue
        path = Path(meta.checkpoint).parent / "metrics.jsonl"
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
        probes = pd.DataFrame([{k: v for k, v in r.items() if k == "step" or k.startswith("probe/")}
                               for r in rows])  # fmt: skip
        probes = probes.dropna(axis=0, how="all", subset=[c for c in probes.columns if c != "step"] or None)
        if len(probes.columns) > 1 and len(probes):
            logs[run_of(meta.model)] = probes
    return logs


def head_matrix(rows: pd.DataFrame) -> tuple[np.ndarray, list[str], list[int]]:
    """``(scores [heads, steps], head labels L<layer>H<head>, steps)`` of one run at one length."""
    table = rows.pivot_table(index=["layer", "head"], columns="step", values=VALUE, aggfunc="mean")
    labels = [f"L{int(layer)}H{int(head)}" for layer, head in table.index]
    return table.to_numpy(dtype=float), labels, [int(s) for s in table.columns]


def build(results: Results) -> Figure:
    heads = step_rows(results, "retrieval")
    summary = step_rows(results, "analysis_summary")
    summary = summary[(summary["metric"] == "retrieval") & (summary["layer_type"] == "all")]
    runs = models.model_order(heads["run"].unique())
    probes = probe_log(results)
    fig, axes = plt.subplots(len(runs), 2, figsize=(7.0, 0.4 + 2.3 * len(runs)), squeeze=False,
                             gridspec_kw={"width_ratios": [1.15, 1]})  # fmt: skip
    image = None
    for (grid, counts), run in zip(axes, runs, strict=True):
        rows = heads[heads["run"] == run]
        length = int(rows["length"].min())  # the length drawn: the run's shortest analysed
        scores, labels, steps = head_matrix(rows[rows["length"] == length])
        image = grid.imshow(scores, aspect="auto", cmap=CMAP, vmin=0, vmax=1, interpolation="nearest",
                            extent=(-0.5, len(steps) - 0.5, len(labels) - 0.5, -0.5))  # fmt: skip
        grid.grid(False)
        every = max(1, len(steps) // 8)
        grid.set_xticks(range(0, len(steps), every), [str(s) for s in steps[::every]], fontsize=6)
        grid.set_yticks(range(len(labels)), labels, fontsize=5 if len(labels) > 16 else 6)
        grid.set_title(f"{run}: each head's mass on the needle, {length:,} tokens", fontsize=7)
        grid.set_xlabel("training step", fontsize=7)
        mine = summary[(summary["run"] == run) & (summary["length"] == length)].sort_values("step")
        for (statistic, label), style in zip(COUNTS.items(), ("-", "--", ":"), strict=True):
            part = mine[mine["statistic"] == statistic]
            counts.plot(part["step"], part["value"], linestyle=style, marker="o", markersize=2, color="0.15",
                        label=label)  # fmt: skip
        counts.yaxis.set_major_locator(MaxNLocator(integer=True))
        counts.set_ylabel("heads", fontsize=7)
        counts.set_xlabel("training step", fontsize=7)
        counts.set_ylim(0, max(2.0, float(mine["value"][mine["statistic"].isin(list(COUNTS))].max() or 0) + 1))
        counts.set_title("head counts (black), the run's task probes (colour)", fontsize=7)
        handles, names = counts.get_legend_handles_labels()
        if run in probes:
            accuracy = counts.twinx()
            log = probes[run]
            for i, column in enumerate(c for c in log.columns if c != "step"):
                kept = log[["step", column]].dropna()
                accuracy.plot(kept["step"], kept[column], color=f"C{i}", marker="s", markersize=2,
                              label=column.removeprefix("probe/"))  # fmt: skip
            accuracy.set_ylim(-0.02, 1.02)
            accuracy.set_ylabel("probe accuracy", fontsize=7)
            more, more_names = accuracy.get_legend_handles_labels()
            handles, names = handles + more, names + more_names
        else:
            counts.text(0.01, 0.99, "no metrics.jsonl beside the steps: probes not drawn", transform=counts.transAxes,
                        va="top", fontsize=5, color="0.35")  # fmt: skip
        counts.legend(handles, names, fontsize=5, loc="upper left", frameon=False)
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), location="left", fraction=0.04, pad=0.1,
                     label="attention mass on the needle")  # fmt: skip
    return fig


SPEC = Spec(
    "retrieval_steps",
    "Retrieval heads across training, per run",
    "figure",
    ("retrieval", "analysis_summary"),
    "One row per training run, from its step checkpoints (`headprobe analyze RUN --steps ...`). Left: every head "
    "(L<layer>H<head>, rows) at every step (columns), coloured by its attention mass on the needle at the answer "
    "steps with the answer teacher-forced (the retrieval table's forced_mass, 0-1, defined whether or not the model "
    "answers), at the run's shortest analysed length. Right, at the same length: the count of retrieval heads "
    "(answer forced: solid; needle-reading: dashed; Wu's, from answered samples: dotted) and, on the right axis, "
    "the run's own task probes from its metrics.jsonl (accuracy of each task at its distance: needle, recall, "
    "list), on the same step axis.",
    build,
    "model",
)
