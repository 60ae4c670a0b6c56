"""``headprobe ruler eval``: greedy decoding on RULER-style samples, scored exactly as RULER scores.

For each model, in ``OUT`` (one model) or ``OUT/<name>/`` (several, as in ``headprobe analyze``):

* ``predictions/<task>-<length>.jsonl``: the working files, appended per batch (a rerun continues);
* ``ruler_samples.parquet`` and the derived ``ruler_scores.parquet`` (:mod:`headprobe.evals.ruler.tables`).

``OUT/run.json`` records the command, settings, versions, models and failures. Samples of one task and
length decode together in batches of left-padded KV caches (as many as the memory allows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headprobe.evals.ruler.generate import CweRule, Fit, RulerError, RulerGenerator
from headprobe.evals.ruler.predictions import Predictions
from headprobe.evals.ruler.samples import qa_file_kinds, read_samples
from headprobe.evals.ruler.scoring import postprocess
from headprobe.evals.ruler.tables import RULER_SAMPLES, RULER_SCORES, aggregate, score_rows
from headprobe.evals.ruler.tasks import TASKS, Task, resolve_tasks
from headprobe.evals.ruler.templates import resolve_wrapper
from headprobe.probe import ProbedModel, load_model, parse_dtype
from headprobe.runs import (
    DoesNotFit,
    Progress,
    RunReport,
    Silent,
    available_memory,
    checkpoint_name,
    resume_key,
    run_models,
    write_results,
)


@dataclass
class RulerSettings:
    """What decides a RULER-style evaluation's numbers.

    Attributes:
        tasks: task names (``["all"]`` for all 13).
        lengths: target lengths in tokens.
        samples: samples per task and length.
        seed: generation seed.
        haystack_files: text files replacing the generated prose of the essay haystack.
        qa_files: SQuAD v2 and/or HotpotQA dev files (else the built-in generated set).
        data: read samples from this JSON-lines file instead of generating them.
        wrapper: RULER's model template: ``base``, ``chat`` or a string/file with ``{task_template}``.
        fit: ``ruler`` (RULER's size search, samples below the target) or ``tight`` (each sample fills its
            budget), :class:`~headprobe.evals.ruler.generate.Fit`.
        cwe_rule: ``ruler`` or ``fit``, :class:`~headprobe.evals.ruler.generate.CweRule`.
        dtype: the model's dtype (:data:`headprobe.probe.DTYPES`); ``None`` = as saved.
    """

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    lengths: list[int] = field(default_factory=lambda: [4096])
    samples: int = 25
    seed: int = 42
    haystack_files: list[str] | None = None
    qa_files: list[str] | None = None
    data: str | None = None
    wrapper: str = "base"
    fit: str = "ruler"
    cwe_rule: str = "ruler"
    dtype: str | None = None

    def validate(self) -> list[Task]:
        """The chosen tasks; raises naming the first bad setting."""
        parse_dtype(self.dtype)
        if not self.lengths or min(self.lengths) < 1:
            raise RulerError("`lengths` must be positive token counts")
        if self.samples < 1:
            raise RulerError("`samples` must be >= 1")
        try:
            Fit(self.fit), CweRule(self.cwe_rule)
        except ValueError as err:
            raise RulerError(str(err)) from None
        return resolve_tasks(self.tasks)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def key(self, checkpoint: str | Path, prompt_start: list[int]) -> dict[str, Any]:
        """The resume key of a model's predictions: everything that decides a prompt and its answer
        except the task, length and index (which each prediction line holds)."""
        return resume_key(
            checkpoint=str(Path(checkpoint).resolve()),
            seed=self.seed,
            wrapper=self.wrapper,
            fit=self.fit,
            cwe_rule=self.cwe_rule,
            dtype=self.dtype,
            data=self.data,
            haystack_files=self.haystack_files,
            qa_files=self.qa_files,
            prompt_start=prompt_start,
        )


MAX_BATCH = 32


def decode_batch_size(model: ProbedModel, length: int, memory_limit: int | None, requested: int | None = None) -> int:
    """How many samples of ``length`` tokens decode together: their KV caches must fit in half of what one
    prefill pass leaves free (at most ``MAX_BATCH``); ``requested`` is checked the same way. Raises with
    the numbers when not even one sample fits."""
    prefill = model.memory(length)
    budget = memory_limit or available_memory(model.device)
    per_sample = model.kv_cache_bytes(length + max(t.tokens_to_generate for t in TASKS.values()))
    if prefill.total + per_sample > 0.9 * budget:
        raise DoesNotFit(
            f"{model.name} at {length:,} tokens needs about {(prefill.total + per_sample) / 2**30:.2f} GiB "
            f"({prefill.describe()} + KV cache {per_sample / 2**30:.2f} GiB), but only {budget / 2**30:.2f} GiB is "
            "available; use shorter `lengths` or a larger machine"
        )
    fits = max(1, int((0.9 * budget - prefill.total) * 0.5 // per_sample))
    if requested is None:
        return min(fits, MAX_BATCH)
    if requested > fits:
        raise DoesNotFit(
            f"`batch_size` {requested} at {length:,} tokens needs {requested * per_sample / 2**30:.2f} GiB of KV "
            f"cache; at most {fits} fit in {budget / 2**30:.2f} GiB; use a smaller `batch_size` (0 = automatic)"
        )
    return requested


def load_samples(model: ProbedModel, checkpoint: str | Path, s: RulerSettings, tasks: list[Task]) -> list[dict]:
    """The samples to evaluate: read from ``s.data`` (filtered to the tasks, lengths and sample count), or
    generated for the model's tokenizer, its prompt start kept free."""
    if s.data:
        wanted = {t.name for t in tasks}
        samples = [x for x in read_samples(s.data) if x["task"] in wanted and x["length"] in s.lengths]
        return [x for x in samples if x["index"] < s.samples]
    gen = RulerGenerator(
        model.tokenizer,
        s.seed,
        [Path(f) for f in s.haystack_files or []] or None,
        qa_file_kinds(s.qa_files),
        reserve=len(model.prompt_start),
        wrapper=resolve_wrapper(s.wrapper, checkpoint),
        fit=s.fit,
        cwe_rule=s.cwe_rule,
    )
    return list(gen.samples(tasks, s.lengths, s.samples))


def decode_group(
    model: ProbedModel, task: str, group: list[dict], batch: int, store: Predictions, progress: Progress
) -> None:
    """Decode the samples of one task and length that have no prediction yet, ``batch`` at a time,
    appending each batch's predictions when it ends."""
    length = group[0]["length"]
    done = store.done(task, length)
    progress.describe(f"{task} @ {length:,}")
    progress.advance(sum(x["index"] in done for x in group))
    pending = [x for x in group if x["index"] not in done]
    stop = [model.tokenizer.eos_id] if model.tokenizer.eos_id is not None else None
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        prompts = [torch.tensor([model.encode_prompt(x["input"] + x["answer_prefix"])]) for x in chunk]
        outputs = model.decode_batch(prompts, TASKS[task].tokens_to_generate, stop)
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
            }
            for x, ids, new in zip(chunk, prompts, outputs, strict=True)
        ]
        store.append(task, length, rows)
        progress.advance(len(rows))


def evaluate(
    checkpoint: str | Path,
    out: str | Path,
    settings: RulerSettings,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    batch_size: int | None = None,
    name: str | None = None,
) -> pd.DataFrame:
    """Generate (or read) the samples, decode greedily, score; returns the model's ``ruler_scores``.

    ``batch_size`` samples decode together (``None``: as many as the memory allows, see
    :func:`decode_batch_size`)."""
    progress, out = progress or Silent(), Path(out)
    name = name or checkpoint_name(checkpoint)
    tasks = settings.validate()
    model = load_model(checkpoint, device=device, dtype=parse_dtype(settings.dtype))
    batch = {}
    for length in settings.lengths:
        model.check_length(length)
        batch[length] = decode_batch_size(model, length, memory_limit, batch_size)
    store = Predictions(out)
    store.claim(settings.key(checkpoint, model.prompt_start))  # before generating: a refusal costs nothing
    samples = load_samples(model, checkpoint, settings, tasks)
    trained = getattr(model, "trained_length", None)
    if trained and max(settings.lengths) > trained:
        progress.log(
            f"note: {model.name} was trained on {trained:,}-token sequences; longer lengths measure extrapolation"
        )
    groups: dict[tuple[str, int], list[dict]] = {}
    for x in samples:
        groups.setdefault((x["task"], x["length"]), []).append(x)
    progress.start(len(samples), name)
    for (task, length), group in groups.items():
        decode_group(model, task, group, batch[length], store, progress)
    rows = {f"{t}-{n}": [r for r in store.done(t, n).values() if r["index"] < settings.samples] for t, n in groups}
    table = score_rows(name, tasks, rows)
    scores = aggregate(table, tasks)
    write_results(out, name, checkpoint, settings.to_dict(), ((RULER_SAMPLES, table), (RULER_SCORES, scores)))
    return scores


def evaluate_many(
    checkpoints: Sequence[str | Path], out: str | Path, settings: RulerSettings, **kwargs: Any
) -> RunReport[pd.DataFrame]:
    """:func:`evaluate` for each checkpoint (e.g. the members of a grid) on the same samples.

    One checkpoint writes into ``out`` itself; several write into ``out/<name>/`` each. A checkpoint that
    fails (missing, too short a context, out of memory) is reported under ``errors`` and the others run.
    """
    settings.validate()  # bad settings fail once, before any checkpoint is loaded

    def job(path: Path, folder: Path, name: str) -> pd.DataFrame:
        return evaluate(path, folder, settings, name=name, **kwargs)

    progress = kwargs.get("progress") or Silent()
    return run_models(checkpoints, Path(out), job, progress, ("ruler eval", settings.to_dict()))
