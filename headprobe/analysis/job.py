"""``headprobe analyze``: every requested metric of every checkpoint at every length, resumable.

Output for each checkpoint, in ``OUT/<name>/`` (tables through :mod:`headprobe.results`, each with a
``model`` column):

* ``entropy``, ``reordering``: one row per layer x head x length x sample;
* ``erank``: one row per residual site x length (positions pooled over the samples);
* ``retrieval``: one row per layer x head x length (mean copy score over kept samples, with
  ``n_kept``/``n_samples``), ``retrieval_samples`` (every needle sample) and ``retrieval_copies`` (every
  head's copy score in every sample, what the mean is taken over);
* ``analysis_summary``: the derived aggregates (:mod:`headprobe.analysis.summary`);
* ``parts/``: one table per work unit (metric x length x sample; metric x length when pooled) with its
  resume key: what a rerun skips, so an interrupted run at a long length loses at most one sample.

The job is :class:`AnalyzeJob` (:mod:`headprobe.jobs.job`): under ``torchrun`` its work items
(:func:`plan_items`) are shared among the processes, down to single samples, and the first process merges the
parts: the same tables, byte for byte, as one process writes.

``OUT/run.json`` records the command, settings, versions, checkpoints and failures. A checkpoint that
fails to load, has bad inputs or would not fit in memory is reported and skipped before any of its
work starts; memory is estimated per length from the model's shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.analysis import items
from headprobe.analysis.settings import AnalyzeError, AnalyzeSettings
from headprobe.analysis.summary import ANALYSIS_SUMMARY, summarize
from headprobe.core.paths import CONTENT
from headprobe.core.progress import Progress
from headprobe.core.resume import done_earlier
from headprobe.hooked import HookedModel, load_model, parse_dtype
from headprobe.jobs.job import Env, Job, Plan, Target, run_job
from headprobe.jobs.memory import MemoryBudget, require_fits
from headprobe.jobs.parts import Parts, check_parts
from headprobe.jobs.provenance import table_meta, write_results
from headprobe.jobs.record import RunReport
from headprobe.metrics import DecodeMetric, Metric, PassMetric
from headprobe.metrics.agreement import DEFINITION_NAMES, HEAD_AGREEMENT, head_agreement
from headprobe.metrics.retrieval import forced_answer
from headprobe.results import Schema
from headprobe.text.needles import NeedleError, needle_prompt, needle_set

MEMORY_FIX = "analyse fewer rows (`rows` last:N or stride:N), shorter `lengths` or fewer `metrics`"


def check_inputs(model: HookedModel, name: str, settings: AnalyzeSettings, budget: MemoryBudget) -> None:
    """Refuse, before any work, lengths beyond the model's positions, needles that do not fit, and
    lengths whose estimated memory exceeds the budget."""
    needle_metrics = [m for m in settings.chosen() if isinstance(m, DecodeMetric)]
    needs_needles = ", ".join(m.name for m in needle_metrics)
    # room after the prompt: the decoding budget where a metric decodes, else the forced answer (checked per needle)
    room = settings.max_new_tokens if any(m.generates for m in needle_metrics) else 0
    # a model without a chat template refuses chat
    wrapper = model.prompt_wrapper(settings.prompt_format) if needle_metrics else None
    for length in settings.lengths:
        model.check_length(length + room)
        if wrapper is not None:  # every needle prompt must fit, with its forced answer
            for needle in needle_set(settings.needles):
                try:
                    prompt = needle_prompt(
                        model.tokenizer, needle, length, 50.0, start=model.prompt_start, wrapper=wrapper
                    )
                except NeedleError as err:  # too short for the needle and its question: which model, and the fix
                    raise AnalyzeError(f"{name}: {err}; use longer `lengths` for {needs_needles}") from None
                model.check_length(prompt.length + len(forced_answer(model.tokenizer, prompt)[0]) - 1)
        cached = length + room if needle_metrics else 0
        keeps_top = any(getattr(m, "min_topk", 0) for m in settings.chosen())  # only reordering keeps top keys
        topk = settings.topk if keeps_top else 0
        estimate = model.memory(length, rows=settings.row_selection.count(length), topk=topk, cached_tokens=cached)
        fix = MEMORY_FIX + (f", or a smaller `topk` ({topk:,} now)" if topk > 16 else "")
        require_fits(f"{name} at {length:,} tokens", estimate, budget, fix)


def check_folder(parts: Parts, keys: list[dict[str, Any]], folder: Path) -> None:
    """Refuse, before the model loads, a results folder whose finished parts were made from another
    checkpoint or with other settings (:func:`headprobe.jobs.parts.check_parts`): a rerun adds metrics, lengths or
    a metric's new revision to a folder, and never replaces one model's results by another's, or mixes
    settings."""
    check_parts(parts, keys, folder, free=("metric", "revision", "length", "prompt_start"))


@dataclass(frozen=True)
class PassItem:
    """Forward passes at one ``length``: sample ``i`` computes the metrics ``per_sample[i]``, and the
    ``pooled`` metrics see every sample (:func:`headprobe.analysis.items.text_items`)."""

    length: int
    per_sample: dict[int, tuple[PassMetric, ...]]
    pooled: tuple[PassMetric, ...] = ()

    def units(self) -> list[tuple[Metric, int | None]]:
        return [(m, i) for i, ms in self.per_sample.items() for m in ms] + [(m, None) for m in self.pooled]


@dataclass(frozen=True)
class DecodeItem:
    """One needle prompt (``sample``) at one ``length`` for the decode ``metrics`` still to do on it: the
    retrieval-head definitions among them share their forward passes
    (:func:`headprobe.metrics.definitions.run_probes`)."""

    length: int
    sample: int
    metrics: tuple[DecodeMetric, ...]

    def units(self) -> list[tuple[Metric, int | None]]:
        return [(m, self.sample) for m in self.metrics]


Item = PassItem | DecodeItem


def part_name(length: int, sample: int | None) -> str:
    """The resumable part of one length (pooled tables) or one sample at one length."""
    return str(length) if sample is None else f"{length}-s{sample}"


def part_tables(metric: Metric) -> tuple[Schema, ...]:
    """The tables of ``metric`` written as parts, one per work unit (the rest are combined from them)."""
    return metric.per_sample if isinstance(metric, DecodeMetric) else metric.tables


def _units(metric: Metric, settings: AnalyzeSettings) -> int:
    """Work units of ``metric`` at one length: one per sample, one in all when pooled."""
    return 1 if isinstance(metric, PassMetric) and metric.pooled else settings.samples


def plan_items(
    settings: AnalyzeSettings, keys: dict[tuple[str, int], dict[str, Any]], parts: Parts, processes: int
) -> tuple[list[Item], list[tuple[Metric, int, int]]]:
    """The items still to do (the same list on every process) and, per metric and length, how many of
    its units were done earlier ``(metric, length, units done)``.

    A unit is one metric at one length for one sample (one length for pooled metrics). One process
    runs all pass metrics of a length in one item, one forward pass per sample shared by every metric;
    several processes get one item per sample and one for the pooled metrics (whose own passes they
    then repeat), so that the passes spread over them. Each needle sample is an item, of every decode metric
    still to do on it."""
    planned: list[Item] = []
    done_before = []
    metrics = settings.chosen()
    for length in settings.lengths:

        def todo(m: Metric, sample: int | None, length: int = length) -> bool:
            key = keys[m.name, length]
            return not all(parts.done(t.table, part_name(length, sample), key) for t in part_tables(m))

        per_sample: dict[int, tuple[PassMetric, ...]] = {}
        for i in range(settings.samples):
            mine = tuple(m for m in metrics if isinstance(m, PassMetric) and not m.pooled and todo(m, i))
            if mine:
                per_sample[i] = mine
        pooled = tuple(m for m in metrics if isinstance(m, PassMetric) and m.pooled and todo(m, None))
        if processes == 1 and (per_sample or pooled):
            planned.append(PassItem(length, per_sample, pooled))
        elif processes > 1:
            planned += [PassItem(length, {i: ms}) for i, ms in per_sample.items()]
            planned += [PassItem(length, {}, pooled)] if pooled else []
        for i in range(settings.samples):
            mine = tuple(m for m in metrics if isinstance(m, DecodeMetric) and todo(m, i))
            planned += [DecodeItem(length, i, mine)] if mine else []
        for m in metrics:
            left = sum(u[0] is m for item in planned if item.length == length for u in item.units())
            done_before.append((m, length, _units(m, settings) - left))
    return planned, done_before


def unit_name(metric: Metric, length: int, sample: int | None) -> str:
    """One unit of work as the item log names it: ``entropy @ 256 sample 0`` (``erank @ 256`` when pooled)."""
    return f"{metric.name} @ {length}" + ("" if sample is None else f" sample {sample}")


class AnalyzeJob(Job[AnalyzeSettings]):
    """``headprobe analyze`` (the module docstring): the requested metrics of one checkpoint at every length."""

    command = "analyze"
    adds = ("metrics", "lengths")  # what a rerun into a folder adds to (other settings must stay: check_parts)

    def reads(self) -> list[str | Path | None]:
        return [*(self.settings.haystack_files or []), self.settings.needles]

    def units(self, checkpoints: int) -> int:
        per_checkpoint = sum(_units(m, self.settings) for m in self.settings.chosen()) * len(self.settings.lengths)
        return per_checkpoint * checkpoints  # counted as done: a failed checkpoint leaves its undone ones uncounted

    def plan(self, target: Target, env: Env) -> Plan[Item]:
        """Every item of one checkpoint still to do (finished parts skipped), into ``target.folder``; it
        finishes with the model's tables and its ``analysis_summary``."""
        settings, progress, name, path = self.settings, env.progress, target.name, target.path
        model = load_model(path, device=env.device, dtype=parse_dtype(settings.dtype), log=progress.log)
        metrics, parts = settings.chosen(), Parts(target.folder)
        keys = {(m.name, n): settings.key(m, n, path, model.prompt_start) for m in metrics for n in settings.lengths}
        check_folder(parts, list(keys.values()), target.folder)
        check_inputs(model, name, settings, MemoryBudget.of(env.device, env.memory_limit))
        planned, done_before = plan_items(settings, keys, parts, env.ranks.size)
        for m, length, done in done_before:
            if done:
                progress.log(done_earlier(f"{name} {m.name} @ {length}", done, _units(m, settings)))
                progress.advance(done)

        def write(m: Metric, length: int, sample: int | None, frames: dict[str, pd.DataFrame]) -> None:
            key = keys[m.name, length]
            for schema in part_tables(m):
                meta = table_meta(schema.table, name, path, settings.to_dict(), key=key)
                parts.write(schema, part_name(length, sample), frames[schema.table].assign(model=name), meta)
            progress.advance()

        inputs = functools.lru_cache(maxsize=1)(lambda length: items.haystack_inputs(model, length, settings))
        prompts = functools.lru_cache(maxsize=1)(lambda length: items.needle_prompts(model, length, settings))

        def do(item: Item) -> None:
            names = ", ".join(dict.fromkeys(m.name for m, _ in item.units()))
            if isinstance(item, DecodeItem):
                progress.describe(f"{name} {names} @ {item.length:,}, sample {item.sample + 1}/{settings.samples}")
                prompt = prompts(item.length)[item.sample]
                done = items.decode_items(model, item.length, settings, item.metrics, prompt, item.sample)
                for m, frames in done.items():
                    for why in items.missing(frames):
                        progress.log(f"{name} {m.name} @ {item.length} sample {item.sample}: no number, {why}")
                    write(m, item.length, item.sample, frames)
                return
            progress.describe(f"{name} {names} @ {item.length:,}")

            def sample_done(i: int, frames: dict[str, pd.DataFrame]) -> None:
                for m in item.per_sample.get(i, ()):
                    write(m, item.length, i, frames)

            pooled = items.text_items(
                model, item.length, settings, inputs(item.length), item.per_sample, item.pooled, sample_done
            )
            for m in item.pooled:
                write(m, item.length, None, pooled)

        return Plan(
            planned,
            do,
            finish=lambda: write_tables(parts, settings, keys, model, name, path, target.folder, progress),
            names=lambda item: [unit_name(m, item.length, sample) for m, sample in item.units()],
            units=lambda item: len(item.units()),
            error=AnalyzeError,
        )


def write_tables(
    parts: Parts,
    settings: AnalyzeSettings,
    keys: dict[tuple[str, int], dict[str, Any]],
    model: HookedModel,
    name: str,
    path: Path,
    folder: Path,
    progress: Progress,
) -> pd.DataFrame:
    """Write a model's tables and ``analysis_summary`` from every part its folder holds finished
    (:func:`held_lengths`: this run's and earlier runs'), saying which finished lengths an earlier revision
    of a metric made (left out); returns the summary."""
    held = held_lengths(parts, settings, keys)
    for m, stale in stale_lengths(parts, settings, held).items():
        progress.log(
            f"{name} {m.name} @ {', '.join(map(str, stale))}: made by an earlier revision of the metric, left out of "
            f"the tables; rerun with --metrics {m.name} --lengths {','.join(map(str, stale))} to redo it"
        )
    tables = gather_tables(parts, settings, held)
    summary = summarize(name, tables, list(held))
    schemas = [schema for m in held for schema in m.tables]
    tables_written = [*((t, tables[t.table]) for t in schemas), (ANALYSIS_SUMMARY, summary)]
    defined = {n: tables[n] for n in DEFINITION_NAMES if n in tables}
    if len(defined) >= 2:  # two definitions or more: how far they agree
        tables_written.append((HEAD_AGREEMENT, head_agreement(defined)))
    write_results(folder, name, path, folder_settings(settings, held, parts), tables_written, facts=model.facts())
    return summary


def _unit_names(m: Metric, settings: AnalyzeSettings, length: int) -> list[str]:
    """The parts of ``m`` at ``length``: one per sample, or one for the length when pooled."""
    pooled = isinstance(m, PassMetric) and m.pooled
    return [part_name(length, None if pooled else i) for i in range(_units(m, settings))]


def _finished_lengths(parts: Parts, m: Metric, settings: AnalyzeSettings) -> dict[int, dict[str, Any]]:
    """The lengths at which every part of ``m`` is finished with one key, and that key."""
    table = part_tables(m)[0].table
    found = parts.keys(table)
    lengths = sorted({int(item.split("-")[0]) for item in found if item.split("-")[0].isdigit()})
    out = {}
    for n in lengths:
        keys = [found.get(unit) for unit in _unit_names(m, settings, n)]
        others = [parts.keys(t.table) for t in part_tables(m)[1:]]
        if (
            keys[0] is not None
            and all(k == keys[0] for k in keys)
            and all(o.get(unit) == keys[0] for o in others for unit in _unit_names(m, settings, n))
        ):
            out[n] = keys[0]
    return out


def held_lengths(
    parts: Parts, settings: AnalyzeSettings, keys: dict[tuple[str, int], dict[str, Any]]
) -> dict[Metric, list[int]]:
    """What the folder's tables describe: per metric (in the registry's order), the lengths (ascending) at which
    every part is finished with this revision of the metric. That is this run's metrics and lengths (just
    finished) and those of earlier runs into the folder: a rerun that asks for less adds to the tables,
    never drops what is there (:func:`check_parts` made sure that every part has this run's settings)."""
    from headprobe.metrics import METRICS

    held: dict[Metric, list[int]] = {}
    for m in METRICS.values():
        finished = _finished_lengths(parts, m, settings)
        lengths = sorted(
            n for n, key in finished.items()
            if key == keys.get((m.name, n)) or ((m.name, n) not in keys and key.get("revision") == m.revision)
        )  # fmt: skip
        if lengths:
            held[m] = lengths
    return held


def stale_lengths(parts: Parts, settings: AnalyzeSettings, held: dict[Metric, list[int]]) -> dict[Metric, list[int]]:
    """Per metric, the finished lengths left out of the tables: made by an earlier revision of the metric."""
    from headprobe.metrics import METRICS

    stale = {m: sorted(set(_finished_lengths(parts, m, settings)) - set(held.get(m, []))) for m in METRICS.values()}
    return {m: lengths for m, lengths in stale.items() if lengths}


def folder_settings(settings: AnalyzeSettings, held: dict[Metric, list[int]], parts: Parts) -> dict[str, Any]:
    """The settings that describe a model's folder: this run's, with ``metrics`` and ``lengths`` those the
    folder holds (:func:`held_lengths`) and, for a metric only an earlier run computed, its own settings
    (its needles, say) as that run recorded them."""
    described = settings.to_dict() | {
        "metrics": [m.name for m in held],
        "lengths": sorted({n for lengths in held.values() for n in lengths}),
    }
    for m in held:
        if m.name in settings.metrics:
            continue
        earlier = parts.keys(part_tables(m)[0].table)
        key = next((k for k in earlier.values() if k), {})
        described |= {name: key[name] for name in m.settings if name in key}
        for name in (f"{name}{CONTENT}" for name in m.settings):  # its files' content, as that run read them
            described.pop(name, None)
            described |= {name: key[name]} if name in key else {}
    return described


def gather_tables(parts: Parts, settings: AnalyzeSettings, held: dict[Metric, list[int]]) -> dict[str, pd.DataFrame]:
    """Every table of the ``held`` metrics at their lengths from the finished parts: lengths in order, samples
    in order within each; a decode metric's other tables combined from its per-sample ones, length by length."""
    tables: dict[str, pd.DataFrame] = {}
    for m, lengths in held.items():
        if isinstance(m, PassMetric):
            names = [unit for n in lengths for unit in _unit_names(m, settings, n)]
            tables[m.tables[0].table] = parts.gather(m.tables[0].table, names)
            continue
        by_length = []
        for n in lengths:
            frames = {t.table: parts.gather(t.table, _unit_names(m, settings, n)) for t in m.per_sample}
            by_length.append(items.combine(m, n, frames))
        for t in m.tables:
            tables[t.table] = pd.concat([f[t.table] for f in by_length], ignore_index=True)
    return tables


def analyze(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: AnalyzeSettings | None = None,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport[pd.DataFrame]:
    """Analyse every checkpoint (see the module docstring) with ``settings`` (default
    :class:`AnalyzeSettings`): :func:`headprobe.jobs.job.run_job` of an :class:`AnalyzeJob`. Returns a
    :class:`headprobe.jobs.record.RunReport` (each checkpoint's ``analysis_summary``, the failures;
    ``report.table("entropy")`` reads a table over all models). Lengths beyond what a checkpoint was trained
    on, without ``allow_beyond_trained``, fail the whole run before any model loads
    (:class:`headprobe.hooked.BeyondTrainedError`)."""
    job = AnalyzeJob(settings or AnalyzeSettings())
    return run_job(job, checkpoints, out, device=device, memory_limit=memory_limit, progress=progress)
