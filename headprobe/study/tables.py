"""The study's tables: tidy rows per member x seed x run (written under ``OUT/tables/``), and the
comparisons the study draws from them (mean and spread over seeds), as printed and in ``report.md``.

Every tidy table has the ``model`` column (the results name of the run's checkpoint) and ``member``,
``seed``, ``run`` (a run of the recipe: ``pt``, ``cpt``, ``cpt-frozen``, ``sft``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from headprobe.results import Column, Schema

WHO_COLUMNS = (
    Column("model", "str", "the run's checkpoint (its results name)"),
    Column("member", "str", "the grid member (preset), e.g. toy-k64v16"),
    Column("seed", "int"),
    Column("run", "str", "the recipe's run: pt, cpt, cpt-frozen, sft, ..."),
)

STUDY_RUNS = Schema(
    "study_runs",
    (
        *WHO_COLUMNS,
        Column("stage", "str", "pt, cpt or sft"),
        Column("freeze", "str", "the frozen attention projections, else missing"),
        Column("steps", "int"),
        Column("tokens", "int", "tokens trained on in this run"),
        Column("final_loss", "float", "training loss of the last step (nats per target token)"),
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


def spread(
    frame: pd.DataFrame, index: Sequence[str], columns: Sequence[str], value: str, scale: float = 1.0, digits: int = 1
) -> pd.DataFrame:
    """A wide table of ``value`` (times ``scale``) averaged over seeds, ``index`` as rows and ``columns`` as
    columns; each cell is :func:`mean_sd`'s."""
    if frame.empty:
        return pd.DataFrame()
    stats = mean_sd(frame, [*index, *columns], value, scale, digits)
    wide = stats.pivot_table(index=list(index), columns=list(columns), values="cell", aggfunc="first")
    wide.columns = [" ".join(str(c) for c in (col if isinstance(col, tuple) else (col,))) for col in wide.columns]
    return wide.reset_index()


def comparisons(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The study's comparisons, titled, from the tidy tables (a missing table gives no comparison). Runs
    appear in the recipe's order (the order of the runs table: pt, cpt, cpt-frozen, sft), not alphabetically."""
    out: dict[str, pd.DataFrame] = {}
    order = list(dict.fromkeys(tables.get(STUDY_RUNS.table, pd.DataFrame(columns=["run"]))["run"]))
    tables = {name: _runs_in_order(frame, order) for name, frame in tables.items()}
    probes = tables.get(STUDY_PROBES.table, pd.DataFrame())
    if not probes.empty:
        needle = probes[probes.task == "needle"]
        out["Held-out needle retrieval (% exact) by member and distance (characters)"] = spread(
            needle, ["member", "run"], ["distance"], "accuracy", 100.0
        )
        others = probes[probes.task != "needle"]
        if not others.empty:
            out["Held-out copy and recall (% exact)"] = spread(
                others, ["member", "run"], ["task", "distance"], "accuracy", 100.0
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
    runs = tables.get(STUDY_RUNS.table, pd.DataFrame())
    if not runs.empty:
        out["Final training loss by member and run (nats per target token)"] = spread(
            runs, ["member"], ["run"], "final_loss", digits=3
        )
    short = tables.get(STUDY_SHORTCTX.table, pd.DataFrame())
    if not short.empty:
        out["Short-context accuracy (built-in set, %)"] = spread(short, ["member", "run"], ["metric"], "value", 100.0)
    return out


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
