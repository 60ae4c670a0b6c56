"""``headprobe study``: train the grid of a recipe, measure every run, and compare the members.

``OUT/`` holds everything, each part resumable (a rerun skips what is done):

==================  ==========================================================================
``runs/``           the trained grid (``RUNS/<member>/s<seed>/<run>/``, ``manifest.json``)
``probes/<name>/``  held-out task probes of each run (:mod:`headprobe.text.probes`)
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
from headprobe.evals.ruler.evaluate import RulerSettings
from headprobe.evals.ruler.evaluate import evaluate_many as ruler_many
from headprobe.evals.shortctx.evaluate import ShortCtxSettings
from headprobe.evals.shortctx.evaluate import evaluate_many as shortctx_many
from headprobe.model.answers import exact_answers
from headprobe.model.checkpoint import load_checkpoint
from headprobe.results import Schema, read_table, table_path, write_table
from headprobe.runs import (
    Parts,
    Progress,
    RunReport,
    Silent,
    checkpoint_name,
    held_folder,
    resume_key,
    table_meta,
)
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
from headprobe.text.probes import Probe

WHO = ["model", "member", "seed", "run"]


@dataclass
class StudyReport:
    """What a study produced: its tidy tables and comparisons, and whether training was interrupted."""

    out: Path
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    comparisons: dict[str, pd.DataFrame] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def _runs(manifest: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(manifest["runs"])
    frame.insert(0, "model", [checkpoint_name(c) for c in frame["checkpoint"]])
    return frame


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
    wide.loc[unknown, ["retrieval_heads", "fraction"]] = float("nan")
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
) -> dict[str, pd.DataFrame]:
    """Write every tidy table under ``OUT/tables/`` and the comparisons of those and the ``earlier`` ones
    (already there) to ``OUT/report.md``."""
    schemas: dict[str, Schema] = {schema.table: schema for schema in SCHEMAS}
    for name, frame in tables.items():
        meta = table_meta(name, None, None, settings)
        write_table(out / "tables" / f"{name}.parquet", frame.reset_index(drop=True), meta, schemas[name])
    views = comparisons({**(earlier or {}), **tables})
    text = ["# headprobe study", "", f"Settings: `{json.dumps(settings, default=str)}`", ""]
    for title, frame in views.items():
        text += [f"## {title}", "", markdown(frame), ""]
    if errors:
        text += ["## Failures", "", *(f"- {what}: {message}" for what, message in errors.items()), ""]
    atomic_write_text(out / "report.md", "\n".join(text))
    return views


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
    runs = _runs(manifest)
    errors = report.errors
    tables = {STUDY_RUNS.table: runs[[*WHO, "stage", "freeze", "steps", "tokens", "final_loss"]]}
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
    report.comparisons = write_report(out, tables, record, errors, earlier)
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
