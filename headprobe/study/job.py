"""``headprobe study``: train the grid of a recipe, measure every run, and compare the members.

``OUT/`` holds everything, each part resumable (a rerun skips what is done):

==================  ==========================================================================
``runs/``           the trained grid (``RUNS/<member>/s<seed>/<run>/``, ``manifest.json``)
``probes/<name>/``  held-out task probes of each run (:mod:`headprobe.text.probes`)
``eval_loss/<n>/``  the held-out evaluation loss of a run whose manifest entry lacks it (:func:`eval_loss_table`)
``analysis/``       ``headprobe analyze`` of the ``analysis_runs`` (retrieval with the ``codes`` needles)
``ruler/``          RULER-style evaluation of the ``ruler_runs``
``shortctx/``       the built-in short-context set on the ``shortctx_runs``
``tables/``         the study's tidy tables (:mod:`headprobe.study.tables`)
``report.md``       the comparisons, mean and spread over seeds
==================  ==========================================================================

Training goes through a callable (the trainer plugin's grid): headprobe never imports the trainer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.analysis import AnalyzeSettings, analyze
from headprobe.core.atomic import atomic_write_text
from headprobe.core.progress import Progress, Silent
from headprobe.core.resume import resume_key
from headprobe.evals.ruler.job import evaluate_many as ruler_many
from headprobe.evals.ruler.settings import RulerSettings
from headprobe.evals.shortctx.job import evaluate_many as shortctx_many
from headprobe.evals.shortctx.settings import ShortCtxSettings
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.jobs.folders import held_folder
from headprobe.jobs.parts import Parts
from headprobe.jobs.provenance import table_meta
from headprobe.jobs.record import RunReport
from headprobe.model.answers import exact_answers
from headprobe.model.checkpoint import load_checkpoint
from headprobe.model.eval_loss import split_losses
from headprobe.results import Schema, read_table, table_path, write_table
from headprobe.study.settings import StudyError, StudySettings
from headprobe.study.tables import (
    SCHEMAS,
    STUDY_HEADS,
    STUDY_PROBES,
    STUDY_RULER,
    STUDY_RUNS,
    STUDY_SHORTCTX,
    comparisons,
    markdown,
)
from headprobe.study.verdicts import VERDICTS, verdict_markdown, verdicts
from headprobe.text.heldout import SET_IDENTITY, eval_rows
from headprobe.text.probes import Probe

WHO = ["model", "member", "seed", "run"]
EVAL_LOSSES = ["eval_loss", "eval_loss_local", "eval_loss_retrieval"]


@dataclass
class StudyReport:
    """What a study produced: its tidy tables and comparisons, and whether training was interrupted."""

    out: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    comparisons: dict[str, pd.DataFrame] = field(default_factory=dict)
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per finding (headprobe.study.verdicts)
    errors: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def _runs(manifest: dict[str, Any]) -> pd.DataFrame:
    """The manifest's runs, each with its ``model`` name; ``final_loss`` (the trainer's last-step loss) as
    ``final_curriculum_loss``; the held-out evaluation losses and ``status`` missing where a manifest written
    before the trainer recorded them lacks them (:func:`eval_loss_table` measures the losses)."""
    frame = pd.DataFrame(manifest["runs"]).rename(columns={"final_loss": "final_curriculum_loss"})
    frame.insert(0, "model", [checkpoint_name(c) for c in frame["checkpoint"]])
    for column in EVAL_LOSSES:
        frame[column] = pd.to_numeric(frame[column], errors="coerce") if column in frame else float("nan")
    if "status" not in frame:
        frame["status"] = None
    return frame


def eval_loss_table(runs: pd.DataFrame, folder: Path, device: str, progress: Progress) -> pd.DataFrame:
    """``runs`` with the held-out evaluation losses (:mod:`headprobe.text.heldout`) of every run whose manifest
    entry lacks them (trained before the trainer measured them) measured on its final checkpoint: each run a
    resumable part (``folder/<model>/``) keyed by its checkpoint and the set."""
    missing = runs.index[runs["eval_loss"].isna()]
    if missing.empty:
        return runs
    runs = runs.copy()
    progress.start(len(missing), "held-out evaluation loss")
    for index in missing:
        entry = runs.loc[index]
        parts = Parts(folder / entry.model)
        key = resume_key(checkpoint=str(Path(entry.checkpoint).resolve()), held_out=SET_IDENTITY)
        if not parts.done(STUDY_RUNS.table, "eval", key):
            model, tokenizer = load_checkpoint(entry.checkpoint, device=device)
            frame = runs.loc[[index], STUDY_RUNS.names].assign(**split_losses(model, eval_rows(tokenizer)))
            parts.write(
                STUDY_RUNS, "eval", frame, table_meta(STUDY_RUNS.table, entry.model, entry.checkpoint, {}, key=key)
            )
        runs.loc[index, EVAL_LOSSES] = parts.gather(STUDY_RUNS.table, ["eval"]).loc[0, EVAL_LOSSES].to_numpy(float)
        progress.advance()
    return runs


def probe_table(runs: pd.DataFrame, folder: Path, probes: list[Probe], device: str, progress: Progress) -> pd.DataFrame:
    """Every probe on every run (each run's rows a resumable part keyed by its checkpoint and the probes)."""
    progress.start(len(runs) * len(probes), "task probes")
    frames = []
    for entry in runs.itertuples(index=False):
        parts = Parts(folder / entry.model)
        key = resume_key(checkpoint=str(Path(entry.checkpoint).resolve()), probes=[repr(p) for p in probes])
        if parts.done(STUDY_PROBES.table, "all", key):
            frames.append(parts.gather(STUDY_PROBES.table, ["all"]))
            progress.advance(len(probes))
            continue
        model, tokenizer = load_checkpoint(entry.checkpoint, device=device)
        rows = []
        for probe in probes:
            hits = exact_answers(model, probe.prompts(tokenizer))
            rows.append((probe.task.value, probe.distance, len(hits), sum(hits) / len(hits)))
            progress.advance()
        frame = pd.DataFrame(rows, columns=["task", "distance", "samples", "accuracy"])
        for i, col in enumerate(WHO):
            frame.insert(i, col, getattr(entry, col))
        meta = table_meta(STUDY_PROBES.table, entry.model, entry.checkpoint, {}, key=key)
        parts.write(STUDY_PROBES, "all", frame, meta)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _tag(frame: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (with a ``model`` column) joined to each run's member, seed and run."""
    return runs[WHO].merge(frame, on="model", how="inner")


def _chosen(runs: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    return runs[runs["run"].isin(names)]


def head_table(
    runs: pd.DataFrame, out: Path, s: StudySettings, device: str, progress: Progress, errors: dict
) -> pd.DataFrame:
    chosen = _chosen(runs, s.analysis_runs)
    if chosen.empty:
        return STUDY_HEADS.empty()
    settings = AnalyzeSettings(
        metrics=s.analysis_metrics,
        lengths=s.analysis_lengths,
        samples=s.analysis_samples,
        rows=s.analysis_rows,
        needles="codes",
        needle_reach=s.analysis_needle_reach,
    )
    summary = _results(
        analyze(list(chosen["checkpoint"]), out, settings, device=device, progress=progress), errors, "analyze"
    )
    if summary is None or "retrieval" not in set(summary.metric):
        return STUDY_HEADS.empty()
    retrieval = summary[summary.metric == "retrieval"]
    wide = retrieval.pivot_table(index=["model", "length", "layer_type"], columns="statistic", values="value")
    wide = wide.reset_index()
    kept = retrieval[retrieval.statistic == "n_kept"][["model", "length", "value"]].rename(columns={"value": "n_kept"})
    wide = wide.drop(columns=[c for c in ("n_kept", "n_samples", "mean_score") if c in wide]).merge(
        kept, on=["model", "length"], how="left"
    )
    unknown = wide["n_kept"] == 0  # no needle was copied: no evidence about any head, not "no retrieval heads"
    wide.loc[unknown, ["retrieval_heads", "fraction"]] = float("nan")  # the teacher-forced columns stay: every
    # member has them (forced_retrieval_heads, forced_fraction, forced_mass: analysis_summary's statistics)
    return _tag(wide, runs)


def _results(report: RunReport[pd.DataFrame], errors: dict[str, str], what: str) -> pd.DataFrame | None:
    """The reports' frames (each with its ``model``) concatenated; failures go to ``errors``."""
    errors.update({f"{what} {name}": message for name, message in report.errors.items()})
    frames = [f.assign(model=name) for name, f in report.results.items()]
    return pd.concat(frames, ignore_index=True) if frames else None


def ruler_table(
    runs: pd.DataFrame, out: Path, s: StudySettings, device: str, progress: Progress, errors: dict
) -> pd.DataFrame:
    chosen = _chosen(runs, s.ruler_runs)
    if chosen.empty:
        return STUDY_RULER.empty()
    settings = RulerSettings(tasks=s.ruler_tasks, lengths=s.ruler_lengths, samples=s.ruler_samples)
    report = ruler_many(list(chosen["checkpoint"]), out, settings, device=device, progress=progress)
    scores = _results(report, errors, "ruler")
    if scores is None:
        return STUDY_RULER.empty()
    return _tag(scores[scores.scope == "length"][["model", "length", "score"]], runs)


def shortctx_table(
    runs: pd.DataFrame, out: Path, s: StudySettings, device: str, progress: Progress, errors: dict
) -> pd.DataFrame:
    chosen = _chosen(runs, s.shortctx_runs)
    if chosen.empty:
        return STUDY_SHORTCTX.empty()
    frames = []
    for task, file in s.shortctx_tasks.items():  # each task in its own folder: OUT/shortctx/<task>/<model>/
        settings = ShortCtxSettings(task=task, file=file)
        report = shortctx_many(list(chosen["checkpoint"]), out / task, settings, device=device, progress=progress)
        scores = _results(report, errors, f"shortctx {task}")
        if scores is not None:
            frames.append(scores[["model", "task", "metric", "value"]])
    return STUDY_SHORTCTX.empty() if not frames else _tag(pd.concat(frames, ignore_index=True), runs)


def write_report(
    out: Path,
    tables: dict[str, pd.DataFrame],
    settings: dict[str, Any],
    errors: dict[str, str],
    earlier: dict[str, pd.DataFrame] | None = None,
) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """Write every tidy table under ``OUT/tables/``, the verdict on each of the study's findings
    (:mod:`headprobe.study.verdicts`, ``OUT/tables/study_verdicts.parquet``), and the comparisons of those
    tables and the ``earlier`` ones (already there) to ``OUT/report.md``, which ends with the verdicts.
    Returns the comparisons and the verdicts."""
    schemas: dict[str, Schema] = {schema.table: schema for schema in SCHEMAS}
    for name, frame in tables.items():
        meta = table_meta(name, None, None, settings)
        write_table(out / "tables" / f"{name}.parquet", frame.reset_index(drop=True), meta, schemas[name])
    everything = {**(earlier or {}), **tables}
    views = comparisons(everything)
    judged = verdicts(everything, out / "analysis")
    meta = table_meta(VERDICTS.table, None, None, settings)
    write_table(out / "tables" / f"{VERDICTS.table}.parquet", judged, meta, VERDICTS)
    text = ["# headprobe study", "", f"Settings: `{json.dumps(settings, default=str)}`", ""]
    for title, frame in views.items():
        text += [f"## {title}", "", markdown(frame), ""]
    if errors:
        text += ["## Failures", "", *(f"- {what}: {message}" for what, message in errors.items()), ""]
    text += ["## Verdicts: the study's findings at this scale", "", verdict_markdown(judged), ""]
    atomic_write_text(out / "report.md", "\n".join(text))
    return views, judged


MEASUREMENTS = ("probes", "heads", "ruler", "shortctx")  # what measure() can do, in the order it does it


def measure(
    manifest: dict[str, Any],
    out: str | Path,
    settings: StudySettings | None = None,
    *,
    parts: Sequence[str] = MEASUREMENTS,
    device: str = "cpu",
    progress: Progress | None = None,
    record: dict[str, Any] | None = None,
) -> StudyReport:
    """Measure the finished runs of a grid (``manifest``: what the trainer's grid writes to
    ``RUNS/manifest.json``) and write the tables and ``report.md`` (see the module docstring).

    ``parts`` chooses the measurements (:data:`MEASUREMENTS`: task probes, retrieval heads and the other
    ``analyze`` metrics, RULER-style, short-context); every part resumes, so measuring again only does what
    is missing. Calls with other ``parts`` or runs (the ``analyses/`` scripts) can share ``out``: a study
    table keeps the rows of the models a call did not measure, and ``report.md`` compares every study
    table there. ``record`` (e.g. the recipe and profile) is stored with the tables."""
    out, settings, progress = Path(out), settings or StudySettings(), progress or Silent()
    settings.validate()
    unknown = sorted(set(parts) - set(MEASUREMENTS))
    if unknown:
        raise StudyError(f"unknown measurements {unknown}; choose from {', '.join(MEASUREMENTS)}")
    if not manifest.get("runs"):
        raise StudyError("the grid's manifest lists no finished run: train the grid first")
    with held_folder(out, "study", {**(record or {}), "measured": list(parts)}):
        return _measure(manifest, out, settings, parts, device, progress, record)


def _measure(
    manifest: dict[str, Any],
    out: Path,
    settings: StudySettings,
    parts: Sequence[str],
    device: str,
    progress: Progress,
    record: dict[str, Any] | None,
) -> StudyReport:
    """:func:`measure`'s work, once the folder is held."""
    report = StudyReport(out)
    runs = eval_loss_table(_runs(manifest), out / "eval_loss", device, progress)
    errors = report.errors
    tables = {STUDY_RUNS.table: runs[STUDY_RUNS.names]}
    if "probes" in parts:
        tables[STUDY_PROBES.table] = probe_table(runs, out / "probes", settings.probe_list(), device, progress)
    if "heads" in parts:
        tables[STUDY_HEADS.table] = head_table(runs, out / "analysis", settings, device, progress, errors)
    if "ruler" in parts:
        tables[STUDY_RULER.table] = ruler_table(runs, out / "ruler", settings, device, progress, errors)
    if "shortctx" in parts:
        tables[STUDY_SHORTCTX.table] = shortctx_table(runs, out / "shortctx", settings, device, progress, errors)
    earlier = {
        schema.table: read_table(table_path(out / "tables", schema.table)).frame
        for schema in SCHEMAS
        if table_path(out / "tables", schema.table).is_file()
    }
    for name, frame in list(tables.items()):
        if name != STUDY_RUNS.table and name in earlier:
            tables[name] = _accumulate(earlier.pop(name), frame)
    report.tables = tables
    earlier.pop(STUDY_RUNS.table, None)  # the manifest is the grid's record of its runs
    record = {**(record or {}), "study": settings.to_dict(), "measured": list(parts)}
    report.comparisons, report.verdicts = write_report(out, tables, record, errors, earlier)
    return report


def _accumulate(earlier: pd.DataFrame, now: pd.DataFrame) -> pd.DataFrame:
    """A study table across calls: ``now``'s rows, and ``earlier``'s rows of the models ``now`` did not
    measure (another script measured other runs into the same folder)."""
    if now.empty or earlier.empty:
        return earlier if now.empty else now
    kept = earlier[~earlier["model"].isin(set(now["model"]))]
    return pd.concat([kept, now], ignore_index=True) if len(kept) else now


def run_study(
    out: str | Path,
    train_grid: Callable[[Path], dict[str, Any]],
    settings: StudySettings | None = None,
    *,
    device: str = "cpu",
    progress: Progress | None = None,
    record: dict[str, Any] | None = None,
) -> StudyReport:
    """Train (``train_grid(RUNS)`` returns the grid's manifest, with ``interrupted`` when it stopped early),
    then :func:`measure` every finished run."""
    out, settings = Path(out), settings or StudySettings()
    settings.validate()
    with held_folder(out, "study"):  # before training: no other command's folder, known as a study at once
        manifest = train_grid(out / "runs")
    if manifest.get("interrupted") or not manifest["runs"]:
        return StudyReport(out, interrupted=bool(manifest.get("interrupted")))
    return measure(manifest, out, settings, device=device, progress=progress, record=record)
