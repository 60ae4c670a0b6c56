"""``headprobe ruler eval``: greedy decoding on RULER-style samples, scored exactly as RULER scores.

For each model, in ``OUT/<name>/`` (however many there are, as in ``headprobe analyze``):

* ``predictions/<task>-<length>.jsonl``: the working files, appended per batch (a rerun continues);
* ``ruler_samples.parquet`` and the derived ``ruler_scores.parquet`` (:mod:`headprobe.evals.ruler.tables`).

``OUT/run.json`` records the command, settings, versions, models and failures. Samples of one task and
length decode together in batches of left-padded KV caches (as many as the memory allows); under
``torchrun`` the batches are shared among the processes.

Before any model loads, the settings are made concrete once for the whole run
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
from headprobe.core.ranks import Ranks
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
from headprobe.hooked import HookedModel, check_trained_lengths, load_model, parse_dtype
from headprobe.jobs.checkpoints import CHECKPOINT_ERRORS, checkpoint_name, run_models
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
    ranks: Ranks | None = None,
) -> pd.DataFrame:
    """Generate (or read) the samples of ``run`` (settings made concrete once for the whole run,
    :func:`headprobe.evals.ruler.resolve.resolve_run`), decode greedily, score; returns the model's
    ``ruler_scores``.

    ``batch_size`` samples decode together (``None``: as many as the memory allows, see
    :func:`decode_batch_size`). With ``ranks`` of several processes (``torchrun``) each decodes its share
    of the batches (each task and length's samples cut into batches alike on every process) and the first
    scores them all; the others return an empty frame."""
    progress, out, ranks = progress or Silent(), Path(out), ranks or Ranks()
    name = name or checkpoint_name(checkpoint)
    settings, tasks, lengths = run.settings, run.tasks, run.settings.lengths or []
    warning = check_trained_lengths(checkpoint, lengths, settings.allow_beyond_trained)  # before the model loads
    if warning:
        progress.log(f"{name}: {warning}")
    model = load_model(checkpoint, device=device, dtype=parse_dtype(settings.dtype), log=progress.log)
    batch = {}
    for length in lengths:
        model.check_length(length)
        batch[length] = decode_batch_size(model, length, memory_limit, batch_size)
    store = Predictions(out, ranks.rank)
    wrapper = model.prompt_wrapper(settings.prompt_format) if run.samples is None else None  # data: as generated
    key = settings.key(checkpoint, model.prompt_start, "as in `data`" if wrapper is None else wrapper.template)
    identity = checkpoint_identity(checkpoint)  # retrained or its config edited at the same path: not its results
    key["weights"], key["config"] = identity.get("weights"), identity.get("config")
    store.check(key)  # before generating: a refusal costs nothing
    samples = load_samples(model, run, wrapper)  # every process generates the same samples
    if run.samples is not None:
        note = check_data_tokenizer(model, samples, settings.data or "")
        if note:
            progress.log(f"{name}: {note}")
    if ranks.is_main:
        store.claim(key)  # only once there is something to predict: a failed generation leaves no claim
    skipped = skipped_tasks(samples, {t.name for t in tasks})
    for line in skip_warnings(skipped):
        progress.log(f"{name}: {line}")
    groups: dict[tuple[str, int], list[dict]] = {}
    for x in samples:
        groups.setdefault((x["task"], x["length"]), []).append(x)
    # the work items: each task and length's samples in batches, the same batches however many processes
    chunks = [(task, g[i : i + batch[n]]) for (task, n), g in groups.items() for i in range(0, len(g), batch[n])]
    predicted = functools.cache(lambda task, length: set(store.done(task, length)))  # read once per task, length
    for (task, length), group in groups.items():
        done = sum(x["index"] in predicted(task, length) for x in group)
        if done:
            progress.log(done_earlier(f"{name} {task} @ {length:,}", done, len(group)))
    progress.start(len(samples), name)
    with ranks.together(CHECKPOINT_ERRORS, RulerError):
        for index, (task, chunk) in enumerate(chunks):
            if ranks.mine(index):  # another process decodes the others
                decode_chunk(model, task, chunk, predicted(task, chunk[0]["length"]), store, progress)
                ranks.did(f"{name} {task} @ {chunk[0]['length']} samples {chunk[0]['index']}-{chunk[-1]['index']}")
    if not ranks.is_main:
        return pd.DataFrame()
    progress.advance(ranks.others([len(c) for _, c in chunks]))
    rows = {f"{t}-{n}": [r for r in store.done(t, n).values() if r["index"] < settings.samples] for t, n in groups}
    table = score_rows(name, tasks, rows)
    scores = aggregate(table, tasks, skipped)
    write_results(
        out, name, checkpoint, settings.to_dict(), ((RULER_SAMPLES, table), (RULER_SCORES, scores)), model.facts()
    )
    return scores


def evaluate_many(
    checkpoints: Sequence[str | Path], out: str | Path, settings: RulerSettings, **kwargs: Any
) -> RunReport[pd.DataFrame]:
    """:func:`evaluate` for each checkpoint (e.g. the members of a grid) on the same samples.

    Each checkpoint writes into ``out/<name>/``, one as several. A checkpoint that
    fails (missing, too short a context, out of memory) is reported under ``errors`` and the others run.
    Bad settings or data, and lengths beyond what any checkpoint was trained on (without
    ``allow_beyond_trained``), fail the whole run before any checkpoint is loaded.
    """
    run = resolve_run(settings)  # once: every checkpoint evaluates this run
    settings = run.settings
    if (kwargs.get("batch_size") or 0) < 0:
        raise RulerError(f"`batch_size` {kwargs['batch_size']}: give a positive number of samples (0 = automatic)")
    for path in checkpoints:
        check_trained_lengths(path, settings.lengths or [], settings.allow_beyond_trained)

    ranks = Ranks.from_env()  # several processes under torchrun: each decodes its share
    kwargs["device"] = ranks.device(kwargs.get("device", "cpu"))
    if not ranks.is_main:
        kwargs["progress"] = Silent()

    def job(path: Path, folder: Path, name: str) -> pd.DataFrame:
        return evaluate(path, folder, run, name=name, ranks=ranks, **kwargs)

    progress = kwargs.get("progress") or Silent()
    reads = [settings.data, *(settings.haystack_files or []), *(settings.qa_files or [])]
    return run_models(checkpoints, Path(out), job, progress, ("ruler eval", settings.to_dict()), ranks, reads=reads)
