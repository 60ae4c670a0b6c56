"""``headprobe ruler eval``: greedy decoding on RULER-style samples, scored exactly as RULER scores.

For each model, in ``OUT/<name>/`` (however many there are, as in ``headprobe analyze``):

* ``predictions/<task>-<length>.jsonl``: the working files, appended per batch (a rerun continues);
* ``ruler_samples.parquet`` and the derived ``ruler_scores.parquet`` (:mod:`headprobe.evals.ruler.tables`).

``OUT/run.json`` records the command, settings, versions, models and failures. Samples of one task and
length decode together in batches of left-padded KV caches (as many as the memory allows); under
``torchrun`` the batches are shared among the processes.

The job is :class:`RulerJob` (:mod:`headprobe.jobs.job`). Before any model loads, the settings are made
concrete once for the whole run
(:func:`headprobe.evals.ruler.resolve.resolve_run`: with ``data`` the lengths and tasks it holds, unless
given) and each checkpoint's lengths are checked against what it was trained on
(:func:`headprobe.hooked.check_trained_lengths`). Tasks skipped at a length (too long for it) are left out
of that length's mean, which says so (:mod:`headprobe.evals.ruler.tables`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headprobe.core.identity import checkpoint_identity
from headprobe.core.progress import Progress, Silent
from headprobe.core.resume import done_earlier
from headprobe.evals.ruler.generate import RulerGenerator
from headprobe.evals.ruler.predictions import Predictions
from headprobe.evals.ruler.resolve import RulerRun, resolve_run
from headprobe.evals.ruler.samples import qa_file_kinds, skip_warnings, skipped_tasks
from headprobe.evals.ruler.scoring import postprocess
from headprobe.evals.ruler.settings import RulerError, RulerSettings
from headprobe.evals.ruler.tables import RULER_SAMPLES, RULER_SCORES, aggregate, score_rows
from headprobe.evals.ruler.tasks import TASKS
from headprobe.evals.ruler.templates import BASE_WRAPPER
from headprobe.hooked import HookedModel, load_model, parse_dtype
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.jobs.job import Env, Job, Plan, Target, run_job, run_one
from headprobe.jobs.memory import USABLE, DoesNotFit, MemoryBudget, require_fits
from headprobe.jobs.provenance import write_results
from headprobe.jobs.record import RunReport
from headprobe.text.prompt_format import Wrapper

MAX_BATCH = 32


def decode_batch_size(model: HookedModel, length: int, memory_limit: int | None, requested: int | None = None) -> int:
    """How many samples of ``length`` tokens decode together: their KV caches must fit in half of what one
    prefill pass leaves free (at most ``MAX_BATCH``); ``requested`` is checked the same way. Raises with
    the numbers when not even one sample fits."""
    prefill = model.memory(length)
    budget = MemoryBudget.of(model.device, memory_limit)
    per_sample = model.kv_cache_bytes(length + max(t.tokens_to_generate for t in TASKS.values()))
    one = dataclasses.replace(prefill, kv_cache=prefill.kv_cache + per_sample)  # one sample's prefill and cache
    require_fits(f"{model.name} at {length:,} tokens", one, budget, "use shorter `lengths`")
    fits = max(1, int((USABLE * budget.bytes - prefill.total) * 0.5 // per_sample))
    if requested is None:
        return min(fits, MAX_BATCH)
    if requested > fits:
        raise DoesNotFit(
            f"`batch_size` {requested} at {length:,} tokens needs {requested * per_sample / 2**30:.2f} GiB of KV "
            f"cache; at most {fits} fit ({budget}); use a smaller `batch_size` (0 = automatic)"
        )
    return requested


def load_samples(model: HookedModel, run: RulerRun, wrapper: Wrapper | None) -> list[dict]:
    """The samples to evaluate: those of the data file (:func:`headprobe.evals.ruler.resolve.resolve_run`), or
    generated for the model's tokenizer in ``wrapper``, its prompt start kept free (tasks too long for a length
    skipped there)."""
    if run.samples is not None or wrapper is None:
        return run.samples or []
    s = run.settings
    gen = RulerGenerator(
        model.tokenizer,
        s.seed,
        [Path(f) for f in s.haystack_files or []] or None,
        qa_file_kinds(s.qa_files),
        reserve=len(model.prompt_start),
        wrapper=wrapper,
        fit=s.fit,
        cwe_rule=s.cwe_rule,
    )
    return list(gen.samples(run.tasks, s.lengths or [], s.samples))


MEASURED_PER_LENGTH = 8  # samples of a data file measured with the model's tokenizer, per length


def check_data_tokenizer(model: HookedModel, samples: list[dict[str, Any]], data: str | Path) -> str | None:
    """Samples of a ``data`` file are fitted to one tokenizer: refuse those that record another than the
    model's (their lengths would be wrong for it); of samples that record none (RULER's own files), say
    how long they are for this model, measured (the first :data:`MEASURED_PER_LENGTH` of each length)."""
    ours = model.tokenizer.fingerprint
    theirs = sorted({str(x["tokenizer"]) for x in samples if x.get("tokenizer")})
    if theirs == [ours] or not samples:
        return None
    counts: dict[int, list[int]] = {}
    for x in samples:  # a few per length say enough (every sample's count is in ruler_samples' token_count)
        if len(counts.setdefault(int(x["length"]), [])) < MEASURED_PER_LENGTH:
            counts[int(x["length"])].append(len(model.encode_prompt(x["input"] + x["answer_prefix"])))
    measured = "; ".join(f"at {n:,} tokens they are {min(c):,}-{max(c):,}" for n, c in sorted(counts.items()))
    if theirs:
        raise RulerError(
            f"`data` {data} was generated for another tokenizer ({', '.join(theirs)}) than {model.name}'s "
            f"({ours}); for this model its samples are too long or too short ({measured}); generate samples "
            f"for it (`headprobe ruler generate --tokenizer {getattr(model.tokenizer, 'path', 'byte')}`), or evaluate "
            "without `data`"
        )
    return f"`data` {data} records no tokenizer; measured with this model's: {measured}"


def sample_format(sample: dict[str, Any]) -> str:
    """The prompt format a sample was made in: as recorded, else read from its wrapper (older files)."""
    if sample.get("prompt_format"):
        return str(sample["prompt_format"])
    return "plain" if sample.get("wrapper") in (None, BASE_WRAPPER) else "custom"


def decode_chunk(
    model: HookedModel, task: str, chunk: list[dict], done: Collection[int], store: Predictions, progress: Progress
) -> None:
    """Decode, as one batch, the samples of ``chunk`` (one task and length) whose index is not in ``done``
    (predicted earlier), and append their predictions when it ends."""
    length = chunk[0]["length"]
    progress.describe(f"{task} @ {length:,}")
    progress.advance(sum(x["index"] in done for x in chunk))
    pending = [x for x in chunk if x["index"] not in done]
    if not pending:
        return
    prompts = [torch.tensor([model.encode_prompt(x["input"] + x["answer_prefix"])]) for x in pending]
    budget = TASKS[task].tokens_to_generate
    where = f"{task} @ {length:,}, {len(pending)} samples"

    def step(n: int) -> None:  # progress within a batch: a long prompt's tokens come seconds apart on a CPU
        progress.describe(f"{where}, token {n}/{budget}")

    outputs = model.decode_batch(prompts, budget, model.stop_ids, on_step=step)
    rows = [
        {
            "index": x["index"],
            "pred": postprocess(model.tokenizer.decode(new)),
            "outputs": x["outputs"],
            "token_count": ids.shape[1],
            "fit": x.get("fit"),
            "fill": x.get("fill"),
            "source": x.get("source"),
            "haystack": x.get("haystack"),
            "prompt_format": sample_format(x),
        }
        for x, ids, new in zip(pending, prompts, outputs, strict=True)
    ]
    store.append(task, length, rows)
    progress.advance(len(rows))


class RulerJob(Job[RulerSettings]):
    """``headprobe ruler eval`` (the module docstring): every sample of the run, decoded and scored, for one
    checkpoint. ``batch_size`` samples decode together (``None``: as many as the memory allows, see
    :func:`decode_batch_size`). :meth:`prepare` makes the settings concrete once for the whole run
    (:func:`headprobe.evals.ruler.resolve.resolve_run`)."""

    command = "ruler eval"

    def __init__(self, settings: RulerSettings, batch_size: int | None = None) -> None:
        super().__init__(settings)
        self.batch_size = batch_size
        self.run: RulerRun | None = None

    @classmethod
    def of_run(cls, run: RulerRun, batch_size: int | None = None) -> RulerJob:
        """The job of a run resolved already."""
        job = cls(run.settings, batch_size)
        job.run = run
        return job

    def prepare(self, checkpoints: Sequence[Path]) -> None:
        if (self.batch_size or 0) < 0:
            raise RulerError(f"`batch_size` {self.batch_size}: give a positive number of samples (0 = automatic)")
        self.run = resolve_run(self.settings)  # validated and made concrete once: every checkpoint evaluates this
        self.settings = self.run.settings

    def reads(self) -> list[str | Path | None]:
        s = self.settings
        return [s.data, *(s.haystack_files or []), *(s.qa_files or [])]

    def plan(self, target: Target, env: Env) -> Plan[tuple[str, list[dict]]]:
        """Generate (or read) the run's samples for ``target``'s model, refuse a folder of other settings, and
        cut each task and length's samples still to predict into batches (the same batches on every
        process); it finishes scoring every prediction, the model's ``ruler_scores``."""
        if self.run is None:
            raise RuntimeError("RulerJob.plan before prepare")
        run, progress, name, out = self.run, env.progress, target.name, target.folder
        settings, tasks, lengths = run.settings, run.tasks, run.settings.lengths or []
        model = load_model(target.path, device=env.device, dtype=parse_dtype(settings.dtype), log=progress.log)
        batch = {}
        for length in lengths:
            model.check_length(length)
            batch[length] = decode_batch_size(model, length, env.memory_limit, self.batch_size)
        store = Predictions(out, env.ranks.rank)
        wrapper = model.prompt_wrapper(settings.prompt_format) if run.samples is None else None  # data: as made
        key = settings.key(target.path, model.prompt_start, "as in `data`" if wrapper is None else wrapper.template)
        identity = checkpoint_identity(target.path)  # retrained or its config edited at the same path: not its results
        key["weights"], key["config"] = identity.get("weights"), identity.get("config")
        store.check(key)  # before generating: a refusal costs nothing
        samples = load_samples(model, run, wrapper)  # every process generates the same samples
        if run.samples is not None:
            note = check_data_tokenizer(model, samples, settings.data or "")
            if note:
                progress.log(f"{name}: {note}")
        if env.ranks.is_main:
            store.claim(key)  # only once there is something to predict: a failed generation leaves no claim
        skipped = skipped_tasks(samples, {t.name for t in tasks})
        for line in skip_warnings(skipped):
            progress.log(f"{name}: {line}")
        groups: dict[tuple[str, int], list[dict]] = {}
        for x in samples:
            groups.setdefault((x["task"], x["length"]), []).append(x)
        chunks = [(task, g[i : i + batch[n]]) for (task, n), g in groups.items() for i in range(0, len(g), batch[n])]
        predicted = functools.cache(lambda task, length: set(store.done(task, length)))  # read once per task, length
        for (task, length), group in groups.items():
            done = sum(x["index"] in predicted(task, length) for x in group)
            if done:
                progress.log(done_earlier(f"{name} {task} @ {length:,}", done, len(group)))
        progress.start(len(samples), name)

        def finish() -> pd.DataFrame:
            rows = {
                f"{t}-{n}": [r for r in store.done(t, n).values() if r["index"] < settings.samples] for t, n in groups
            }
            table = score_rows(name, tasks, rows)
            scores = aggregate(table, tasks, skipped)
            tables = ((RULER_SAMPLES, table), (RULER_SCORES, scores))
            write_results(out, name, target.path, settings.to_dict(), tables, model.facts())
            return scores

        return Plan(
            chunks,
            lambda item: decode_chunk(
                model, item[0], item[1], predicted(item[0], item[1][0]["length"]), store, progress
            ),
            finish,
            names=lambda item: [
                f"{item[0]} @ {item[1][0]['length']} samples {item[1][0]['index']}-{item[1][-1]['index']}"
            ],
            units=lambda item: len(item[1]),
            error=RulerError,
        )


def evaluate(
    checkpoint: str | Path,
    out: str | Path,
    run: RulerRun,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    batch_size: int | None = None,
    name: str | None = None,
) -> pd.DataFrame:
    """One checkpoint of a resolved ``run`` into ``out`` itself, in this process
    (:func:`headprobe.jobs.job.run_one` of a :class:`RulerJob`); returns the model's ``ruler_scores``."""
    target = Target(Path(checkpoint), name or checkpoint_name(checkpoint), Path(out))
    return run_one(RulerJob.of_run(run, batch_size), target, Env(device, memory_limit, progress or Silent()))


def evaluate_many(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: RulerSettings,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    batch_size: int | None = None,
) -> RunReport[pd.DataFrame]:
    """Every checkpoint (e.g. the members of a grid) on the same samples, each into ``out/<name>/``:
    :func:`headprobe.jobs.job.run_job` of a :class:`RulerJob`. A checkpoint that fails (missing, too short a
    context, out of memory) is reported under ``errors`` and the others run. Bad settings or data, and lengths
    beyond what any checkpoint was trained on (without ``allow_beyond_trained``), fail the whole run before
    any checkpoint is loaded."""
    job = RulerJob(settings, batch_size)
    return run_job(job, checkpoints, out, device=device, memory_limit=memory_limit, progress=progress)
