"""The study's tables: tidy rows per member x seed x run (written under ``OUT/tables/``), and the
comparisons the study draws from them (means over seeds with 95% intervals), as printed and in ``report.md``.

Every tidy table has the ``model`` column (the results name of the run's checkpoint) and ``member``,
``seed``, ``run`` (a run of the recipe: ``pt``, ``cpt``, ``cpt-frozen``, ``sft``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from headprobe.results import Column, Schema
from headprobe.study.intervals import seed_mean, wilson

WHO_COLUMNS = (
    Column("model", "str", "the run's checkpoint (its results name)"),
    Column("member", "str", "the grid member (preset), e.g. toy-k64v16"),
    Column("seed", "int"),
    Column("run", "str", "the recipe's run: pt, cpt, cpt-frozen, sft, ..."),
)

RUN_KEY = ("member", "seed", "run")  # one run of the grid

STUDY_RUNS = Schema(
    "study_runs",
    (
        *WHO_COLUMNS,
        Column("stage", "str", "pt, cpt or sft"),
        Column("freeze", "str", "the frozen attention projections, else missing"),
        Column("steps", "int"),
        Column("tokens", "int", "tokens trained on in this run"),
        Column(
            "final_curriculum_loss",
            "float",
            "the last step's training loss (nats per target token) on the targets of that step's batch: for a "
            "curriculum, of whatever level the run reached, so not comparable across runs (eval_loss is)",
        ),
        Column(
            "eval_loss",
            "float",
            "the final weights' loss on the held-out set, every target (headprobe.text.heldout; nats per target token)",
        ),
        Column(
            "eval_loss_local",
            "float",
            "the same, the targets predictable within an 8-token window (prose, in-window copies)",
        ),
        Column(
            "eval_loss_retrieval",
            "float",
            "the same, the targets only recoverable from beyond the window (needle values 500 and 1,500 "
            "characters back)",
        ),
        Column(
            "status",
            "str",
            "trained or diverged (the trainer's rules: trainer/divergence.py); missing for a run trained before "
            "the trainer recorded it",
        ),
    ),
)
STUDY_PROBES = Schema(
    "study_probes",
    (
        *WHO_COLUMNS,
        Column("task", "str", "needle, recall or copy (headprobe.text.tasks)"),
        Column("distance", "int", "characters between the fact and the question (bytes for byte-level models)"),
        Column("samples", "int"),
        Column("accuracy", "float", "share of held-out examples answered exactly by greedy decoding (0-1)"),
    ),
)
STUDY_HEADS = Schema(
    "study_heads",
    (
        *WHO_COLUMNS,
        Column("length", "int", "analysis length in tokens"),
        Column("layer_type", "str", "full, sliding or all"),
        Column(
            "retrieval_heads",
            "float",
            "heads with retrieval score (copies / span, Wu et al.'s code) >= 0.1; missing when no sample was kept",
        ),
        Column("heads", "float", "heads of that layer type"),
        Column("fraction", "float", "retrieval_heads / heads"),
        Column("n_kept", "float", "needle samples whose answer passed the ROUGE filter (all layer types)"),
        Column(
            "forced_retrieval_heads",
            "float",
            "heads with teacher-forced score (the needle's answer forced, every sample counted) >= 0.1; never missing",
        ),
        Column("forced_fraction", "float", "forced_retrieval_heads / heads"),
        Column("forced_mass", "float", "mean over the heads of the needle span's attention mass at the answer steps"),
        Column(
            "reading_heads",
            "float",
            "needle-reading heads: the head's own forced_mass (the needle reach counted: analysis_needle_reach) "
            ">= 0.1; never missing",
        ),
        Column("reading_fraction", "float", "reading_heads / heads"),
    ),
)
STUDY_RULER = Schema(
    "study_ruler",
    (
        *WHO_COLUMNS,
        Column("length", "int", "tokens"),
        Column("score", "float", "RULER-style score, mean over tasks (0-100)"),
    ),
)
STUDY_SHORTCTX = Schema(
    "study_shortctx",
    (*WHO_COLUMNS, Column("task", "str"), Column("metric", "str", "acc or acc_norm"), Column("value", "float", "0-1")),
)
SCHEMAS = (STUDY_RUNS, STUDY_PROBES, STUDY_HEADS, STUDY_RULER, STUDY_SHORTCTX)


def seed_stats(frame: pd.DataFrame, index: Sequence[str], value: str) -> pd.DataFrame:
    """``index``, ``mean``, ``std``, ``count``: ``value`` averaged per seed, then mean and sd over seeds."""
    per_seed = frame.groupby([*index, "seed"], dropna=False)[value].mean().reset_index()
    return per_seed.groupby(list(index), dropna=False)[value].agg(["mean", "std", "count"]).reset_index()


def mean_sd(frame: pd.DataFrame, index: Sequence[str], value: str, scale: float = 1.0, digits: int = 1) -> pd.DataFrame:
    """The ``index`` columns and ``cell``: :func:`seed_stats` (times ``scale``) as ``"mean"`` or, with
    several seeds, ``"mean ± sd"`` (sd over seeds); ``"n/a"`` where all are missing."""
    stats = seed_stats(frame, index, value)

    def cell(row: pd.Series) -> str:
        if pd.isna(row["mean"]):
            return "n/a"
        text = f"{row['mean'] * scale:.{digits}f}"
        return text + (f" ± {row['std'] * scale:.{digits}f}" if row["count"] > 1 else "")

    stats["cell"] = [cell(row) for _, row in stats.iterrows()]
    return stats[[*index, "cell"]]


def mean_interval(
    frame: pd.DataFrame,
    index: Sequence[str],
    value: str,
    scale: float = 1.0,
    digits: int = 1,
    trials: str | None = None,
) -> pd.DataFrame:
    """The ``index`` columns and ``cell``: ``value`` averaged per seed, then over seeds (times ``scale``), with
    its 95% interval: with several seeds, the bootstrap over seeds (:func:`headprobe.study.intervals.seed_mean`);
    with one, Wilson's interval of the share when ``trials`` names the column counting the trials behind each
    row's ``value`` (a probe's ``samples``), else the mean alone. ``"n/a"`` where all are missing."""
    cells = []
    for key, group in frame.groupby(list(index), dropna=False, sort=True, observed=True):
        per_seed = group.groupby("seed")[value].mean().dropna()
        cell = "n/a"
        if len(per_seed) > 1:
            est = seed_mean(per_seed.to_numpy() * scale)
            cell = f"{est.value:.{digits}f} [{est.low:.{digits}f}, {est.high:.{digits}f}]"
        elif len(per_seed) == 1 and trials is not None and group[trials].notna().all():
            n = float(group[trials].sum())
            low, high = wilson(float((group[value] * group[trials]).sum()), n)
            cell = f"{per_seed.iloc[0] * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"
        elif len(per_seed) == 1:
            cell = f"{per_seed.iloc[0] * scale:.{digits}f}"
        cells.append((*(key if isinstance(key, tuple) else (key,)), cell))
    out = pd.DataFrame(cells, columns=[*index, "cell"])
    return out.astype({col: frame[col].dtype for col in index})  # an ordered run column keeps its order


def spread(
    frame: pd.DataFrame,
    index: Sequence[str],
    columns: Sequence[str],
    value: str,
    scale: float = 1.0,
    digits: int = 1,
    trials: str | None = None,
    sd: bool = False,
) -> pd.DataFrame:
    """A wide table of ``value`` (times ``scale``) averaged over seeds, ``index`` as rows and ``columns`` as
    columns; each cell is :func:`mean_interval`'s, the mean and its 95% interval (``sd``: :func:`mean_sd`'s,
    the mean ± the sd over seeds, as the figures' tables show it)."""
    if frame.empty:
        return pd.DataFrame()
    cells = [*index, *columns]
    stats = (
        mean_sd(frame, cells, value, scale, digits) if sd else mean_interval(frame, cells, value, scale, digits, trials)
    )
    wide = stats.pivot_table(index=list(index), columns=list(columns), values="cell", aggfunc="first")
    wide.columns = [" ".join(str(c) for c in (col if isinstance(col, tuple) else (col,))) for col in wide.columns]
    return wide.reset_index()


def comparisons(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The study's comparisons, titled, from the tidy tables (a missing table gives no comparison). Runs
    appear in the recipe's order (the order of the runs table: pt, cpt, cpt-frozen, sft), not alphabetically.
    A diverged run (``study_runs.status``) is in no comparison, never an architecture's number: the last
    table lists those left out."""
    out: dict[str, pd.DataFrame] = {}
    runs = tables.get(STUDY_RUNS.table, pd.DataFrame(columns=["run"]))
    order = list(dict.fromkeys(runs["run"]))
    diverged = diverged_runs(runs)
    tables = {name: _runs_in_order(without_runs(frame, diverged), order) for name, frame in tables.items()}
    probes = tables.get(STUDY_PROBES.table, pd.DataFrame())
    if not probes.empty:
        needle = probes[probes.task == "needle"]
        out["Held-out needle retrieval (% exact) by member and distance (characters)"] = spread(
            needle, ["member", "run"], ["distance"], "accuracy", 100.0, trials="samples"
        )
        others = probes[probes.task != "needle"]
        if not others.empty:
            out["Held-out copy and recall (% exact)"] = spread(
                others, ["member", "run"], ["task", "distance"], "accuracy", 100.0, trials="samples"
            )
    ruler = tables.get(STUDY_RULER.table, pd.DataFrame())
    if not ruler.empty:
        out["RULER-style score (0-100, mean over tasks) by member and length"] = spread(
            ruler, ["member", "run"], ["length"], "score", 1.0
        )
    heads = tables.get(STUDY_HEADS.table, pd.DataFrame())
    if not heads.empty:
        kept = heads[heads.layer_type != "sliding"]
        out["Retrieval heads (score >= 0.1), before and after cpt: count"] = spread(
            kept, ["member"], ["run", "layer_type"], "retrieval_heads"
        )
        out["Retrieval heads: fraction of the layer type's heads"] = spread(
            kept, ["member"], ["run", "layer_type"], "fraction", digits=2
        )
        if "forced_retrieval_heads" in kept:  # study_heads written before the teacher-forced score lack it
            out["Teacher-forced retrieval heads (answer forced, every member scored): count"] = spread(
                kept, ["member"], ["run", "layer_type"], "forced_retrieval_heads"
            )
            out["Teacher-forced retrieval heads: fraction of the layer type's heads"] = spread(
                kept, ["member"], ["run", "layer_type"], "forced_fraction", digits=2
            )
            out["Needle attention mass at the answer steps (mean over heads, 0-1)"] = spread(
                kept, ["member"], ["run", "layer_type"], "forced_mass", digits=3
            )
        if "reading_heads" in kept:  # study_heads written before needle-reading heads lack them
            out["Needle-reading heads (forced mass >= 0.1): fraction of the layer type's heads"] = spread(
                kept, ["member"], ["run", "layer_type"], "reading_fraction", digits=2
            )
    healthy = tables.get(STUDY_RUNS.table, pd.DataFrame())
    for column, what in (("eval_loss", "every target"), ("eval_loss_retrieval", "needle values beyond the window")):
        if column in healthy and healthy[column].notna().any():
            title = f"Held-out evaluation loss ({what}; nats per target token, final weights)"
            out[title] = spread(healthy, ["member"], ["run"], column, digits=3)
    short = tables.get(STUDY_SHORTCTX.table, pd.DataFrame())
    if not short.empty:
        out["Short-context accuracy (built-in set, %)"] = spread(short, ["member", "run"], ["metric"], "value", 100.0)
    if not diverged.empty:
        out["Diverged runs (left out of every table above)"] = diverged.reset_index(drop=True)
    return out


def diverged_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs ``study_runs`` marks diverged, as :data:`RUN_KEY` rows (none without a ``status``)."""
    if "status" not in runs.columns:
        return pd.DataFrame(columns=list(RUN_KEY))
    return runs[runs["status"] == "diverged"][list(RUN_KEY)].drop_duplicates().reset_index(drop=True)


def without_runs(frame: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without the rows of ``runs`` (:data:`RUN_KEY`); unchanged when it has no such columns."""
    if runs.empty or not set(RUN_KEY) <= set(frame.columns):
        return frame
    marked = frame.merge(runs.assign(_gone=True), on=list(RUN_KEY), how="left")
    return frame[marked["_gone"].isna().to_numpy()]


def _runs_in_order(frame: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """``frame`` with its ``run`` column ordered as ``order`` (runs not in it follow, alphabetically)."""
    if "run" not in frame or frame.empty:
        return frame
    runs = order + sorted(set(frame["run"]) - set(order))
    return frame.assign(run=pd.Categorical(frame["run"], categories=runs, ordered=True))


def markdown(frame: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table of ``frame`` (its cells as text)."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join("" if pd.isna(v) else str(v) for v in row) + " |")
    return "\n".join(lines)
