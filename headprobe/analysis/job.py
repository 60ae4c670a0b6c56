"""``headprobe analyze``: every requested metric of every checkpoint at every length, resumable.

Output for each checkpoint, in ``OUT/<name>/`` (tables through :mod:`headprobe.results`, each with a
``model`` column):

* ``entropy``, ``reordering``: one row per layer x head x length x sample;
* ``erank``: one row per residual site x length (positions pooled over the samples);
* ``retrieval``: one row per layer x head x length (mean copy score over kept samples, with
  ``n_kept``/``n_samples``), and ``retrieval_samples`` (every needle sample);
* ``analysis_summary``: the derived aggregates (:mod:`headprobe.analysis.summary`);
* ``parts/``: one table per (metric, length) item with its resume key: what a rerun skips.

``OUT/run.json`` records the command, settings, versions, checkpoints and failures. A checkpoint that
fails to load, has bad inputs or would not fit in memory is reported and skipped before any of its
work starts; memory is estimated per length from the model's shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headprobe.analysis import items
from headprobe.analysis.settings import AnalysisError, AnalyzeSettings
from headprobe.analysis.summary import ANALYSIS_SUMMARY, summarize
from headprobe.metrics import DecodeMetric, Metric, PassMetric
from headprobe.model.atomic import folder_lock
from headprobe.probe import ProbedModel, check_trained_lengths, load_model, parse_dtype
from headprobe.ranks import Ranks
from headprobe.runs import (
    CHECKPOINT_ERRORS,
    Parts,
    Progress,
    RunReport,
    Silent,
    available_memory,
    require_fits,
    run_each,
    table_meta,
    write_results,
    write_run_record,
)
from headprobe.text.needles import needle_prompt, needle_set

MEMORY_FIX = (
    "analyse fewer rows (`rows` last:N or stride:N), shorter `lengths` or fewer `metrics`, or use a larger machine"
)


def check_inputs(model: ProbedModel, name: str, s: AnalyzeSettings, budget: int) -> None:
    """Refuse, before any work, lengths beyond the model's positions, needles that do not fit, and
    lengths whose estimated memory exceeds the budget."""
    decodes = any(isinstance(m, DecodeMetric) for m in s.chosen())
    for length in s.lengths:
        model.check_length(length + (s.max_new_tokens if decodes else 0))
        if decodes:  # every needle prompt must fit
            for needle in needle_set(s.needles):
                try:
                    needle_prompt(model.tokenizer, needle, length, 50.0, start=model.prompt_start)
                except ValueError as err:
                    raise AnalysisError(f"{name}: {err}; use longer `lengths` for retrieval") from None
        cached = length + s.max_new_tokens if decodes else 0
        estimate = model.memory(length, rows=s.row_selection.count(length), topk=s.topk, cached_tokens=cached)
        require_fits(f"{name} at {length:,} tokens", estimate, budget, MEMORY_FIX)


def _groups(todo: list[Metric]) -> list[list[Metric]]:
    """Work that runs together: every pass metric in one shared pass, then each decode metric alone."""
    passes = [m for m in todo if isinstance(m, PassMetric)]
    return ([passes] if passes else []) + [[m] for m in todo if isinstance(m, DecodeMetric)]


def _compute(model: ProbedModel, length: int, s: AnalyzeSettings, group: list[Metric]) -> dict[str, pd.DataFrame]:
    if isinstance(group[0], DecodeMetric):
        return items.decode_items(model, length, s, group[0])
    return items.text_items(model, length, s, [m for m in group if isinstance(m, PassMetric)])


def analyze_checkpoint(
    path: Path,
    name: str,
    out: Path,
    s: AnalyzeSettings,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    ranks: Ranks | None = None,
) -> pd.DataFrame:
    """Every item of one checkpoint (skipping finished ones); returns its ``analysis_summary``.

    With ``ranks`` of several processes (``torchrun``), each computes its share of the items and the
    first merges them; the others return an empty frame."""
    progress, ranks = progress or Silent(), ranks or Ranks()
    warning = check_trained_lengths(path, s.lengths, s.allow_beyond_trained)  # before anything heavy loads
    if warning:
        progress.log(f"{name}: {warning}")
    model = load_model(path, device=device, dtype=parse_dtype(s.dtype))
    check_inputs(model, name, s, memory_limit or available_memory(torch.device(device)))
    folder, parts, metrics = out / name, Parts(out / name), s.chosen()
    plan = []  # (length, metrics computed together, resume keys): decided before any part is written
    for length in s.lengths:
        keys = {m.name: s.key(m, length, path, model.prompt_start) for m in metrics}
        todo = [m for m in metrics if not all(parts.done(t.table, str(length), keys[m.name]) for t in m.tables)]
        for m in metrics:
            if m not in todo:
                progress.log(f"{name} {m.name} @ {length}: done earlier, skipped")
                progress.advance()
        plan += [(length, group, keys) for group in _groups(todo)]
    ranks.barrier()  # every process has the same plan before any of them writes a part
    with ranks.together(CHECKPOINT_ERRORS, AnalysisError):
        for index, (length, group, keys) in enumerate(plan):
            if not ranks.mine(index):  # another process's item
                continue
            progress.describe(f"{name} {', '.join(m.name for m in group)} @ {length:,}")
            frames = _compute(model, length, s, group)
            ranks.did(f"{name} {'+'.join(m.name for m in group)} @ {length}")
            for m in group:  # each group's parts are written as soon as it is done
                for schema in m.tables:
                    meta = table_meta(schema.table, name, path, s.to_dict(), key=keys[m.name])
                    parts.write(schema, str(length), frames[schema.table].assign(model=name), meta)
                progress.advance()
    if not ranks.is_main:
        return pd.DataFrame()
    progress.advance(sum(len(group) for i, (_, group, _) in enumerate(plan) if not ranks.mine(i)))
    schemas = [schema for m in metrics for schema in m.tables]
    tables = {t.table: parts.gather(t.table, [str(n) for n in s.lengths]) for t in schemas}
    summary = summarize(name, tables, metrics)
    write_results(
        folder, name, path, s.to_dict(), [*((t, tables[t.table]) for t in schemas), (ANALYSIS_SUMMARY, summary)]
    )
    return summary


def analyze(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: AnalyzeSettings | None = None,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    **changes: Any,
) -> RunReport[pd.DataFrame]:
    """Analyse every checkpoint (see the module docstring) and return a :class:`headprobe.runs.RunReport`
    (each checkpoint's ``analysis_summary``, the failures; ``report.table("entropy")`` reads a table
    over all models). ``changes`` replace fields of ``settings`` (default :class:`AnalyzeSettings`). Lengths
    beyond what a checkpoint was trained on, without ``allow_beyond_trained``, fail the whole run before
    any model loads (:class:`headprobe.probe.BeyondTrainedError`)."""
    settings = dataclasses.replace(settings or AnalyzeSettings(), **changes)
    settings.validate()
    for path in checkpoints:  # lengths beyond training fail the whole run before any model loads
        check_trained_lengths(path, settings.lengths, settings.allow_beyond_trained)
    ranks = Ranks.from_env()  # several processes under torchrun: each takes its share of the items
    device = ranks.device(device)
    out, progress = Path(out), (progress or Silent()) if ranks.is_main else Silent()
    per_checkpoint = len(settings.metrics) * len(settings.lengths)
    progress.start(per_checkpoint * len(checkpoints), "analyze")

    def job(path: Path, name: str) -> pd.DataFrame:
        counted = _Counted(progress)
        try:
            return analyze_checkpoint(path, name, out, settings, device, memory_limit, counted, ranks)
        except CHECKPOINT_ERRORS:
            progress.advance(per_checkpoint - counted.n)  # the bar still ends full
            raise

    with ranks.held_by_main(folder_lock(out)):
        report = run_each(checkpoints, job, progress, out)
        report.primary = ranks.is_main
        if report.results and ranks.is_main:  # nothing is written when every checkpoint failed
            write_run_record(out, "analyze", settings.to_dict(), report)
    return report


class _Counted:
    """A :class:`Progress` that passes everything on and counts the units advanced."""

    def __init__(self, inner: Progress) -> None:
        self.inner, self.n = inner, 0

    def start(self, total: int, description: str = "") -> None:
        self.inner.start(total, description)

    def advance(self, n: int = 1) -> None:
        self.n += n
        self.inner.advance(n)

    def describe(self, description: str) -> None:
        self.inner.describe(description)

    def log(self, message: str) -> None:
        self.inner.log(message)
