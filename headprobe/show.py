"""``headprobe show``: a results folder read back as a few small tables, checkpoints side by side.

Every table is read as :func:`headprobe.results.collect` reads it (recursively: an ``analyze``, ``ruler
eval`` or ``shortctx eval`` output or a whole study folder), so nothing here knows where a file sits:

* ``retrieval``: the top heads of each checkpoint by retrieval score (mean over lengths; both forms: Wu et al.'s
  code's copies / span, which counts repeated copies, and their paper's set form, 0-1; beside them the
  teacher-forced score, 0-1, and the forced mass), and per checkpoint the heads above the retrieval-head
  threshold per layer type, Wu's and teacher-forced (with the mean forced mass);
* ``entropy``, ``reordering``: per-layer-type means, one row per checkpoint;
* ``erank``: mean effective rank per layer type, one row per checkpoint;
* ``needle_margin``: per checkpoint, its heads with the most attention on the needle (mean over lengths), and
  each one's mass and margin at every length: how attention on the needle thins as the context grows;
* ``ruler``: the RULER-style score per length and overall, one row per checkpoint;
* ``shortctx``: short-context accuracy (acc, acc_norm) per task, one row per checkpoint;
* ``graft``: each part set's hybrid (``headprobe graft``), a column per metric and length;
* ``ablation``: needle accuracy per condition (baseline, top / random / named heads ablated), one row per
  checkpoint x task x length; random sets as their mean with the range over seeds;
* ``definitions``: per checkpoint and length, the top heads by each retrieval-head definition it holds
  (``retrieval_forced``, ``needle_mass``, ``query_focus``, ``echo``, ``induction``, ``logit_contrib``; Wu's
  ``retrieval`` has its own table above), as ``layer.head``, side by side;
* ``head_agreement``: how far those definitions agree per checkpoint and length (Spearman over the heads, top-k
  Jaccard), one row per pair;
* ``verdicts``: a study's verdict on each of its findings (``study_verdicts``, written by ``headprobe study``:
  :mod:`headprobe.study.verdicts`), our value with its 95% interval, the published value, the verdict and why.

Rows are keyed by what made them (:func:`headprobe.results.collect`): a table without a ``model`` column
(the ``retrieval`` tables ``analyze`` wrote before every table got one) takes the model its metadata names,
and results of different checkpoints or settings that share a name are shown apart, each labelled with what
differs (``toy-d64-s0-pt-final (gridA)``, ``tiny (seed 7)``), never pooled into one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from headprobe.margin_table import top_heads
from headprobe.metrics.summaries import RETRIEVAL_THRESHOLD
from headprobe.results import ResultsError, collect, read_tables
from headprobe.verdict_table import verdict_cells

SHOWN = (
    "retrieval",
    "needle_margin",
    "entropy",
    "reordering",
    "erank",
    "ruler",
    "shortctx",
    "ablation",
    "graft",
    "definitions",
    "head_agreement",
    "verdicts",
)
DEFINITION_TABLES = ("retrieval_forced", "needle_mass", "query_focus", "echo", "induction", "logit_contrib")
SCORE_COLUMNS = {  # the retrieval table's scores, as shown
    "value": "copies/span",
    "set_value": "set (0-1)",
    "forced_value": "forced (0-1)",
    "forced_mass": "forced mass",
}
SCORE_NOTE = (
    "means over lengths of Wu et al.'s retrieval score in two forms: copies/span, as their code counts (needle-token "
    "copies / answer-span length, a repeated copy counted again, so it can pass 1); set (0-1), as their paper "
    "defines it (each needle token once). Retrieval heads: copies/span >= 0.1. forced (0-1): the same copies with "
    "the needle's answer teacher-forced, over every sample, so a model that answers no needle has it too; needle "
    "mass: the attention on the answer span at those answer steps (0-1). Ranked by copies/span, then forced"
)


DIVERGED = " (diverged)"  # after the checkpoint name of a run its study marks diverged


@dataclass(frozen=True)
class ShownTable:
    """One table to print: a title, a note under it, and the frame (index = row labels)."""

    title: str
    frame: pd.DataFrame
    note: str = ""


def _per_layer_type(frame: pd.DataFrame, what: str) -> ShownTable:
    table = frame.groupby(["model", "layer_type"])["value"].mean().unstack("layer_type")
    return ShownTable(
        f"{what}: mean per layer type", table, "one row per checkpoint and settings; means over heads, lengths, samples"
    )


def show_tables(folder: str | Path, metrics: list[str] | None = None, top: int = 10) -> list[ShownTable]:
    """The tables of ``metrics`` (default all of :data:`SHOWN`) that ``folder`` holds; raises ``ValueError``
    naming what exists when it holds none of them."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ResultsError(f"{folder} is not a folder; give a results folder (what analyze, ruler eval or study wrote)")
    wanted = metrics or list(SHOWN)
    unknown = [m for m in wanted if m not in SHOWN]
    if unknown:
        raise ResultsError(f"unknown `metric` {', '.join(unknown)}; choose from {', '.join(SHOWN)}")
    out: list[ShownTable] = []
    diverged = _diverged(folder)
    if "retrieval" in wanted:
        out += _retrieval_tables(folder, top, diverged)
    if "needle_margin" in wanted:
        frame = _collect(folder, "needle_margin", diverged)
        if not frame.empty:
            out.append(margin_table(frame, top))
    for name in ("entropy", "reordering", "erank"):
        if name in wanted:
            frame = _collect(folder, name, diverged)
            if not frame.empty:
                out.append(_per_layer_type(frame, name))
    if "ruler" in wanted:
        frame = _collect(folder, "ruler_scores", diverged)
        if not frame.empty:
            rows = frame[frame["scope"].isin(["length", "overall"])].copy()
            rows["row"] = rows.apply(
                lambda r: "overall" if r["scope"] == "overall" else f"{int(r['length']):,}", axis=1
            )
            table = rows.pivot_table(index="model", columns="row", values="score", aggfunc="first", sort=False)
            out.append(
                ShownTable("RULER-style score by length", table, "0-100; mean over the tasks scored at each length")
            )
    if "shortctx" in wanted:
        frame = _collect(folder, "shortctx_scores", diverged)
        if not frame.empty:
            frame = frame.assign(column=frame["task"] + " " + frame["metric"])
            table = frame.pivot_table(index="model", columns="column", values="value", aggfunc="first", sort=False)
            out.append(
                ShownTable(
                    "short-context accuracy by task",
                    table,
                    "0-1; acc: the likeliest choice is right, acc_norm: the likeliest per character",
                )
            )
    if "ablation" in wanted:
        frame = _collect(folder, "ablation", diverged)
        if not frame.empty:
            note = "0-1, depths pooled by their prompts; random: mean over the seeds' sets (lowest-highest)"
            out.append(
                ShownTable(
                    "needle accuracy with heads ablated",
                    ablation_table(frame),
                    "; ".join([note, *baseline_caveats(frame)]),
                )
            )
    if "graft" in wanted:
        frame = _collect(folder, "graft", diverged)
        if not frame.empty:
            out.append(graft_table(frame))
    if "definitions" in wanted:
        frames = {n: _collect(folder, n, diverged) for n in DEFINITION_TABLES}
        if any(not f.empty for f in frames.values()):
            out.append(definitions_table({n: f for n, f in frames.items() if not f.empty}, top))
    if "head_agreement" in wanted:
        frame = _collect(folder, "head_agreement", diverged)
        if not frame.empty:
            out.append(agreement_table(frame))
    if "verdicts" in wanted:
        out += verdict_tables(folder)
    if not out:
        raise ResultsError(
            f"{folder} holds none of the tables {', '.join(wanted)} (looked for retrieval, needle_margin, entropy, "
            "reordering, erank, ruler_scores, shortctx_scores, ablation, graft, the head definitions', head_agreement "
            "and study_verdicts Parquet files below it); run `headprobe analyze`, `headprobe ruler eval`, "
            "`headprobe shortctx eval`, `headprobe ablate`, `headprobe graft` or `headprobe study` first"
        )
    return out


def _diverged(folder: Path) -> set[str]:
    """The checkpoints of the runs a study below ``folder`` marks diverged (``study_runs.status``)."""
    runs = collect(folder, "study_runs", recursive=True)
    if runs.empty or "status" not in runs or "model" not in runs:
        return set()
    return set(runs.loc[runs["status"] == "diverged", "model"])


def _collect(folder: Path, table: str, diverged: set[str]) -> pd.DataFrame:
    """``table`` below ``folder`` (:func:`headprobe.results.collect`), each diverged run's checkpoint named with
    `` (diverged)``: its numbers are shown, as what that checkpoint does, never as its architecture's."""
    frame = collect(folder, table, recursive=True)
    if diverged and "model" in frame:
        frame = frame.assign(model=frame["model"].where(~frame["model"].isin(diverged), frame["model"] + DIVERGED))
    return frame


def margin_table(frame: pd.DataFrame, top: int) -> ShownTable:
    """Per checkpoint, its ``top`` heads by mass on the needle (mean over lengths and samples), with the mass and
    the margin at each length (columns ``mass@L`` and ``margin@L``, shortest first)."""
    rows = top_heads(frame, top)
    cells = rows.pivot_table(
        index=["model", "layer", "head", "layer_type"], columns="length", values=["mass", "margin"]
    )
    cells = cells[sorted(cells.columns, key=lambda c: (c[1], c[0] != "mass"))]  # by length, mass first
    cells.columns = [f"{what}@{int(length):,}" for what, length in cells.columns]
    order = rows.drop_duplicates(["model", "place"])[["model", "layer", "head", "layer_type"]]  # most mass first
    table = cells.reindex(pd.MultiIndex.from_frame(order))
    note = (
        "mass: attention on the needle's keys at the teacher-forced answer steps (0-1); margin: the needle's best "
        "key logit minus the best other key's (nats; above 0 the needle wins); means over the samples. Heads ranked "
        "by mass, mean over lengths"
    )
    return ShownTable(f"needle margin: top {top} heads per checkpoint by mass, by length", table.round(3), note)


def definitions_table(frames: dict[str, pd.DataFrame], top: int) -> ShownTable:
    """Per checkpoint, length and place (0 = the highest score), each definition's head there as ``layer.head``
    (ties to the lower layer, then head; empty where the definition has fewer scored heads)."""
    cells = []
    for name, frame in frames.items():
        ranked = frame.dropna(subset=["value"]).sort_values(
            ["model", "length", "value", "layer", "head"], ascending=[True, True, False, True, True]
        )
        ranked = ranked.assign(place=ranked.groupby(["model", "length"]).cumcount())
        ranked = ranked[ranked["place"] < top]
        labels = [f"{int(a)}.{int(b)}" for a, b in zip(ranked["layer"], ranked["head"], strict=True)]
        cells.append(ranked.assign(definition=name, cell=labels))
    rows = pd.concat(cells, ignore_index=True)
    table = rows.pivot_table(index=["model", "length", "place"], columns="definition", values="cell", aggfunc="first")
    table = table.reindex(columns=[n for n in frames if n in table.columns]).fillna("")
    note = "layer.head of each definition's top heads by its score (mean over the samples with a number)"
    return ShownTable(f"head definitions: top {top} heads per checkpoint and length", table, note)


def agreement_table(frame: pd.DataFrame) -> ShownTable:
    """``head_agreement`` as one row per checkpoint, length, layer type and pair of definitions."""
    keys = ["model", "length", "layer_type", "definition_a", "definition_b"]
    table = frame.set_index(keys)[["n_heads", "spearman", "k", "jaccard"]]
    note = (
        "spearman: rank correlation of the two definitions' scores over the heads both score; jaccard: overlap of "
        "their top-k heads (k a tenth of those heads); NaN: undefined (a score without a number, or constant)"
    )
    return ShownTable("head definitions: agreement per pair", table.round(3), note)


def graft_table(frame: pd.DataFrame) -> ShownTable:
    """A ``graft`` table as one row per base, donor and part set (in the run's order), a column per metric and
    length (``needle_accuracy@1,024``; the held-out losses without a length)."""
    cells = frame.assign(
        column=[m if int(n) == 0 else f"{m}@{int(n):,}" for m, n in zip(frame["metric"], frame["length"], strict=True)]
    )
    table = cells.pivot_table(index=["base", "donor", "parts"], columns="column", values="value", aggfunc="first",
                              sort=False)  # fmt: skip
    order = list(dict.fromkeys(cells["column"]))
    note = (
        "parts none: the base itself; all: the donor. needle_accuracy: share of the needle prompts answered (0-1); "
        "*_heads: heads at or above 0.1 (Wu's score, its teacher-forced form, the forced mass); eval_loss: held-out "
        "nats per target token"
    )
    return ShownTable("graft: each part set's hybrid", table.reindex(columns=order).round(3), note)


def _retrieval_tables(folder: Path, top: int, diverged: set[str]) -> list[ShownTable]:
    """The top heads per checkpoint and the retrieval-head counts per layer type, Wu's and teacher-forced (none
    without a table)."""
    out: list[ShownTable] = []
    frame = _collect(folder, "retrieval", diverged)
    if frame.empty:
        return out
    forms = [c for c in SCORE_COLUMNS if c in frame.columns]  # set_value: since revision 5; forced, mass: 6
    heads = frame.groupby(["model", "layer", "head", "layer_type"], as_index=False)[forms].mean()
    ranked = [c for c in ("value", "forced_value") if c in forms]
    best = (
        heads[(heads[ranked] > 0).any(axis=1)]
        .sort_values(["model", *ranked], ascending=[True] + [False] * len(ranked), na_position="last")
        .groupby("model")
        .head(top)
        .set_index(["model", "layer", "head"])
        .rename(columns=SCORE_COLUMNS)
    )
    out.append(ShownTable(f"retrieval: top {top} heads per checkpoint", best, SCORE_NOTE))
    counted = heads.assign(retrieval_head=heads["value"] >= RETRIEVAL_THRESHOLD)  # the study's rule, as analyze
    counts = counted.groupby(["model", "layer_type"]).apply(
        lambda g: f"{int(g['retrieval_head'].sum())} of {len(g)}", include_groups=False
    )
    out.append(
        ShownTable(
            f"retrieval heads (copies/span >= {RETRIEVAL_THRESHOLD}) per layer type",
            counts.unstack("layer_type"),
            "heads that never answered a needle have no score and do not count",
        )
    )
    if "forced_value" in forms and "forced_mass" in forms:
        out.append(_forced_counts(heads))
    return out


def _forced_counts(heads: pd.DataFrame) -> ShownTable:
    """Per checkpoint and layer type, the heads whose teacher-forced score is at least the threshold, of all,
    and their mean forced mass (``heads``: one row per head, its scores' means over lengths)."""
    cells = heads.groupby(["model", "layer_type"]).apply(
        lambda g: (
            f"{int((g['forced_value'] >= RETRIEVAL_THRESHOLD).sum())} of {len(g)}, mass {g['forced_mass'].mean():.3f}"
        ),
        include_groups=False,
    )
    return ShownTable(
        f"teacher-forced retrieval heads (forced >= {RETRIEVAL_THRESHOLD}) and forced mass per layer type",
        cells.unstack("layer_type"),
        "the needle's answer forced after the prompt: every sample counts, so every checkpoint has these; needle "
        "mass: mean over the layer type's heads of the attention on the answer span at the answer steps (0-1)",
    )


def ablation_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``ablation`` table as one row per model x task x length and one column per condition
    (``baseline``, ``top 10 zero``, ``random 10 zero``, ``17.3,18.7 mean``): the accuracy pooled over
    depths (each weighted by its prompts), random sets as the mean over seeds with their range."""
    frame = frame.assign(hits=frame["accuracy"] * frame["n"], heads=frame["heads"].fillna(""))
    keys = ["model", "task", "length", "condition", "mode", "n_heads", "heads", "seed"]
    per_set = frame.groupby(keys, sort=False)[["hits", "n"]].sum().reset_index()
    per_set["accuracy"] = per_set["hits"] / per_set["n"]
    per_set["heads"] = per_set["heads"].where(per_set["condition"] == "heads", "")

    def label(r: pd.Series) -> str:
        if r["condition"] == "baseline":
            return "baseline"
        what = r["heads"] if r["condition"] == "heads" else f"{r['condition']} {int(r['n_heads'])}"
        return f"{what} {r['mode']}"

    per_set["column"] = per_set.apply(label, axis=1)
    cells = per_set.groupby(["model", "task", "length", "column"], sort=False)["accuracy"].agg(
        ["mean", "min", "max", "size"]
    )

    def cell(r: pd.Series) -> str:
        return f"{r['mean']:.2f}" if r["size"] == 1 else f"{r['mean']:.2f} ({r['min']:.2f}-{r['max']:.2f})"

    shown = cells.apply(cell, axis=1).rename("accuracy").reset_index()
    return shown.pivot_table(
        index=["model", "task", "length"], columns="column", values="accuracy", aggfunc="first", sort=False
    )


def baseline_caveats(frame: pd.DataFrame) -> list[str]:
    """A warning per model of an ``ablation`` table whose baseline (nothing ablated) found no needle at some
    task and length: there ablating heads can lower nothing, so the test shows nothing about them."""
    base = frame[frame["condition"] == "baseline"]
    base = base.assign(hits=base["accuracy"] * base["n"])
    cells = base.groupby(["model", "task", "length"], sort=False)[["hits", "n"]].sum().reset_index()
    out = []
    for model, zero in cells[cells["hits"] == 0].groupby("model", sort=False):
        where = ", ".join(f"{r.task} @ {int(r.length):,}" for r in zero.itertuples())
        out.append(
            f"{model}: baseline accuracy 0 at {where}: unablated it never finds the needle there, so ablating heads "
            "can show nothing; choose lengths and needles it answers (analyze's retrieval_samples show which)"
        )
    return out


VERDICT_NOTE = (
    "ours: the statistic from the seed means, [its 95% bootstrap interval over seeds]; published: the study's "
    "own value where it gives one; holds / opposite / inconclusive as docs/study.md (Verdicts) defines them"
)


def verdict_tables(folder: Path) -> list[ShownTable]:
    """Each ``study_verdicts`` table below ``folder``, one row per finding; for a study folder without one (a
    study measured before headprobe wrote verdicts), a line saying how to get it."""
    found = read_tables(folder, "study_verdicts", recursive=True)
    out = []
    for table in found:
        shown = verdict_cells(table.frame).set_index("#")
        where = f" ({table.path.parent.parent.relative_to(folder)})" if len(found) > 1 and table.path else ""
        out.append(ShownTable(f"study verdicts{where}", shown, VERDICT_NOTE))
    if not found and any(p.is_file() for p in folder.rglob("study_runs.parquet")):
        how = (
            "none written here: this study was measured before headprobe wrote verdicts; rerun the same "
            "`headprobe study` command (every finished part is skipped) to write tables/study_verdicts.parquet"
        )
        out.append(ShownTable("study verdicts", pd.DataFrame({"verdicts": [how]})))
    return out
