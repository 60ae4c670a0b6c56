"""``headprobe ablate``: needle accuracy with sets of heads ablated, against the unablated model.

Wu et al. (2025) show that retrieval heads matter by masking them: with the top retrieval heads
ablated, needle-in-a-haystack retrieval breaks; with as many random heads ablated, it does not. This
job runs that test on any model: every condition (:func:`headprobe.ablation.settings.conditions`: the
baseline, the ``top`` set, ``random`` sets per seed, named heads; each in every ablation mode) decodes
the very same prompts, needle prompts at every length and depth and RULER-style ``niah`` samples.

Output, in ``OUT/<model>/`` (tables through :mod:`headprobe.results`):

* ``ablation_samples``: one row per condition x task x length x prompt (the answer and its score);
* ``ablation``: one row per condition x task x length x depth: ``accuracy`` (mean score) over ``n``
  prompts, the table ``headprobe show`` and the ``ablation`` figure read;
* ``parts/``: one table per condition x task x length with its resume key: a rerun skips them.

``OUT/run.json`` records the command, settings, versions and the head sets.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from headprobe.ablation.settings import (
    NEEDLE_TASK,
    WU_SCORES,
    AblateSettings,
    Condition,
    Ranking,
    check_tops,
    conditions,
    parse_spec,
    ranked_heads,
)
from headprobe.core.paths import CONTENT
from headprobe.core.progress import Progress
from headprobe.core.resume import done_earlier, resume_key
from headprobe.evals.ruler.generate import RulerGenerator
from headprobe.evals.ruler.job import decode_batch_size
from headprobe.evals.ruler.scoring import postprocess
from headprobe.evals.ruler.tasks import TASKS
from headprobe.hooked import HookedModel, load_model, parse_dtype
from headprobe.hooked.ablation import AblationError, AblationMode, Head, check_heads
from headprobe.jobs.checkpoints import checkpoint_name
from headprobe.jobs.job import Env, Job, Plan, Target, run_job
from headprobe.jobs.parts import Parts, check_parts
from headprobe.jobs.provenance import table_meta, write_results
from headprobe.jobs.record import RunReport
from headprobe.metrics.retrieval import answer_stops, rouge1_recall
from headprobe.metrics.summaries import RETRIEVAL_THRESHOLD
from headprobe.results import Column, Schema
from headprobe.text.needles import needle_prompt, needle_set
from headprobe.text.prompt_format import Wrapper

CONDITION_COLUMNS = (
    Column(
        "condition",
        "str",
        "baseline, top (the top retrieval heads by Wu's score), top:<definition> (the top heads by another head "
        "definition: top:needle_mass, ...), random (a random set) or heads (named)",
    ),
    Column("mode", "str", "none (baseline), zero or mean"),
    Column("heads", "str", "the heads ablated, LAYER.HEAD comma-joined ('' for the baseline)"),
    Column("n_heads", "int", "how many heads were ablated"),
    Column("seed", "int", "the seed that drew a random set (-1 otherwise)"),
    Column("task", "str", "needle (the analyze needles) or a RULER-style niah task"),
    Column("length", "int", "target prompt length in tokens"),
    Column("depth", "float", "needle depth in percent (NaN for RULER tasks, which place their own)"),
)
ABLATION_SAMPLES = Schema(
    "ablation_samples",
    (
        *CONDITION_COLUMNS,
        Column("sample", "int", "the prompt's index at this task and length (the same prompt in every condition)"),
        Column("response", "str", "the greedy answer"),
        Column("correct", "float", "needle: 1 if ROUGE-1 recall > 0.5 else 0; RULER: the task's metric / 100"),
        Column("token_count", "int", "prompt tokens"),
        Column("prompt_format", "str", "plain, chat or custom"),
    ),
)
ABLATION = Schema(
    "ablation",
    (
        *CONDITION_COLUMNS,
        Column("accuracy", "float", "mean score of the cell's prompts (0-1)"),
        Column("n", "int", "prompts in the cell"),
    ),
)


@dataclass(frozen=True)
class Prompt:
    """One prompt every condition decodes: ``ids`` (prompt start included), how to score its answer."""

    task: str
    length: int
    sample: int
    depth: float
    ids: list[int]
    budget: int
    answers: list[str]
    prompt_format: str


def needle_prompts(model: HookedModel, s: AblateSettings, length: int, wrapper: Wrapper) -> list[Prompt]:
    """``samples`` needle prompts at each depth, needles in turn, each with its own haystack seed."""
    needles, out = needle_set(s.needles), []
    for i, (depth, k) in enumerate((d, k) for d in s.depths for k in range(s.samples)):
        needle = needles[(k + s.depths.index(depth)) % len(needles)]
        p = needle_prompt(
            model.tokenizer, needle, length, depth, seed=s.seed + i, start=model.prompt_start, wrapper=wrapper
        )
        out.append(Prompt(NEEDLE_TASK, length, i, depth, p.ids, s.max_new_tokens, [needle.answer], p.prompt_format))
    return out


def ruler_prompts(model: HookedModel, s: AblateSettings, task: str, length: int, wrapper: Wrapper) -> list[Prompt]:
    """Samples ``0 .. samples-1`` of a RULER-style task, as ``ruler eval`` makes them."""
    gen = RulerGenerator(model.tokenizer, s.seed, reserve=len(model.prompt_start), wrapper=wrapper)
    out = []
    for i in range(s.samples):
        x = gen.sample(task, length, i)
        ids = model.encode_prompt(x["input"] + x["answer_prefix"])
        out.append(
            Prompt(task, length, i, float("nan"), ids, TASKS[task].tokens_to_generate, x["outputs"], wrapper.format)
        )
    return out


def score(prompt: Prompt, response: str) -> float:
    """Needle: kept as Wu et al. keep a sample (ROUGE-1 recall > 0.5); RULER: the task's metric, 0-1."""
    if prompt.task == NEEDLE_TASK:
        return float(rouge1_recall(prompt.answers[0], response) > 0.5)
    return TASKS[prompt.task].metric([postprocess(response)], [prompt.answers]) / 100


def decode_prompts(
    model: HookedModel, prompts: Sequence[Prompt], condition: Condition, batch: int, progress: Progress
) -> list[str]:
    """Every prompt's greedy answer under ``condition``: in batches (left-padded caches) for the baseline
    and zero ablation, one prompt at a time for mean ablation (its means follow one sequence)."""
    stops = answer_stops(model) if prompts[0].task == NEEDLE_TASK else model.stop_ids
    size = 1 if condition.mode == AblationMode.MEAN else batch
    answers: list[str] = []
    for start in range(0, len(prompts), size):
        chunk = prompts[start : start + size]
        tensors = [torch.tensor([p.ids]) for p in chunk]
        with contextlib.nullcontext() if condition.mode == "none" else model.ablate(condition.heads, condition.mode):
            tokens = model.decode_batch(tensors, chunk[0].budget, stops)
        answers += [model.tokenizer.decode(t) for t in tokens]
        progress.advance(len(chunk))
    return answers


def sample_rows(condition: Condition, prompts: Sequence[Prompt], answers: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame.from_records(
        condition.columns()
        | {"task": p.task, "length": p.length, "depth": p.depth, "sample": p.sample, "response": a,
           "correct": score(p, a), "token_count": len(p.ids), "prompt_format": p.prompt_format}
        for p, a in zip(prompts, answers, strict=True)
    )  # fmt: skip


def accuracy_table(samples: pd.DataFrame) -> pd.DataFrame:
    """The ``ablation`` table from the per-sample rows: the mean score of each condition x task x length x
    depth cell, with its sample count ``n``."""
    keys = ["condition", "mode", "heads", "n_heads", "seed", "task", "length", "depth"]
    grouped = samples.groupby(keys, dropna=False, sort=False)["correct"]
    out = grouped.agg(accuracy="mean", n="size").reset_index()
    out["depth"] = out["depth"].astype(float)
    return out


class AblateJob(Job[AblateSettings]):
    """``headprobe ablate`` (the module docstring): every condition of one model, each decoding the same
    prompts. :meth:`prepare` ranks each checkpoint's heads by its retrieval scores (``from_results``) once
    for the run, and refuses a missing or unusable table before any model loads."""

    command = "ablate"
    adds = ("heads", "modes", "seeds", "tasks", "lengths")  # the settings a rerun's new items come from

    def __init__(self, settings: AblateSettings) -> None:
        super().__init__(settings)
        self.rankings: dict[Path, list[Ranking]] = {}

    def reads(self) -> list[str | Path | None]:
        return [self.settings.from_results, self.settings.needles]

    def prepare(self, checkpoints: Sequence[Path]) -> None:
        super().prepare(checkpoints)
        s = self.settings
        for path in checkpoints:
            held = s.from_results
            self.rankings[path] = [ranked_heads(held, path, checkpoint_name(path), n) for n in s.score] if held else []
            for ranking in self.rankings[path]:
                check_tops(s, ranking)

    def plan(self, target: Target, env: Env) -> Plan[Item]:
        """Every condition x task x length of one model not finished earlier (the prompts made once, the
        same for every condition); it finishes with the model's ``ablation`` table."""
        s, progress, name, path, folder = self.settings, env.progress, target.name, target.path, target.folder
        rankings = self.rankings.get(path, [])
        for ranking in rankings:
            if ranking.model != name:
                progress.log(
                    f"{name}: ranking heads by the {ranking.score} scores of {ranking.model} in {s.from_results}"
                )
            for k in sorted({int(k) for kind, k in map(parse_spec, s.heads) if kind == "top"}):  # type: ignore[call-overload]
                if ranking.score in WU_SCORES and (weak := ranking.below_threshold(k)):
                    by = "" if ranking.score == "retrieval" else f" by {ranking.score}"
                    progress.log(
                        f"{name}: top:{k}{by} holds {weak} heads scoring below the retrieval-head "
                        f"threshold {RETRIEVAL_THRESHOLD} (only {len(ranking.retrieval_heads)} of its heads are "
                        "retrieval heads)"
                    )
        model = load_model(path, device=env.device, dtype=parse_dtype(s.dtype), log=progress.log)
        every = [Head(info.index, h) for info in model.layers for h in range(info.n_heads)]
        for ranking in rankings:  # a table of another model's shape is refused before any head is chosen from it
            ranking.check_fits(model.layers, name, path)
        runs = conditions(s, every, *rankings)
        for c in runs:  # heads the model lacks (named ones, or a table of another model) fail before any decoding
            check_heads(c.heads, model.layers, name)
        wrapper = model.prompt_wrapper(s.prompt_format)
        prompts: dict[tuple[str, int], list[Prompt]] = {}
        for length in s.lengths:
            model.check_length(length + max(s.max_new_tokens, 128))
            for task in s.tasks:
                made = (
                    needle_prompts(model, s, length, wrapper)
                    if task == NEEDLE_TASK
                    else ruler_prompts(model, s, task, length, wrapper)
                )
                prompts[task, length] = made
        parts = Parts(folder)
        batch = {n: decode_batch_size(model, n, env.memory_limit) for n in s.lengths}
        every_item = [(c, task, length) for c in dict.fromkeys(runs) for (task, length) in prompts]  # a set named twice
        keys = {item: item_key(s, path, model, wrapper, *item) for item in every_item}
        check_parts(parts, list(keys.values()), folder, FREE, by="task", own=("depths",))  # adds items, never mixes
        progress.start(sum(len(prompts[t, n]) for _, t, n in every_item), name)
        todo = []
        for item in every_item:
            c, task, length = item
            if parts.done(ABLATION_SAMPLES.table, part_name(item), keys[item]):
                progress.log(done_earlier(f"{name} {c.label} {task} @ {length:,}", 1, 1))
                progress.advance(len(prompts[task, length]))
            else:
                todo.append(item)

        def do(item: Item) -> None:
            c, task, length = item
            progress.describe(f"{name} {c.label} {task} @ {length:,}")
            answers = decode_prompts(model, prompts[task, length], c, batch[length], progress)
            frame = sample_rows(c, prompts[task, length], answers).assign(model=name)
            meta = table_meta(ABLATION_SAMPLES.table, name, path, s.to_dict(), key=keys[item])
            parts.write(ABLATION_SAMPLES, part_name(item), frame, meta)

        def finish() -> pd.DataFrame:
            held = parts.keys(ABLATION_SAMPLES.table)  # this run's items, and those earlier runs added to the folder
            names = [part_name(item) for item in every_item]
            names += sorted(item for item in held if item not in names and held[item] is not None)
            samples = parts.gather(ABLATION_SAMPLES.table, names)
            table = accuracy_table(samples)
            settings = held_settings(s, [k for k in (held[item] for item in names) if k is not None])
            tables = [(ABLATION_SAMPLES, samples), (ABLATION, table)]
            write_results(folder, name, path, settings, tables, model.facts())
            return table

        units = lambda item: len(prompts[item[1], item[2]])  # noqa: E731
        return Plan(todo, do, finish, names=lambda item: [part_name(item)], units=units, error=AblationError)


Item = tuple[Condition, str, int]  # one condition x task x length: decodes one prompt set, writes one part


def part_name(item: Item) -> str:
    """An item's resumable part: ``top-10-zero-needle-2048`` (the condition's label, the task and length)."""
    c, task, length = item
    return f"{c.label}-{task}-{length}"


FREE = ("condition", "task", "length")  # what a rerun into a folder adds to: the items (other settings must stay)
NEEDLES_CONTENT = f"needles{CONTENT}"  # a needles file's content, in the keys and settings


def held_settings(s: AblateSettings, keys: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The settings that describe a model's folder: this run's, with the head sets, modes, seeds, tasks and
    lengths of every item it holds (``keys``: their resume keys), whichever run added them."""
    sets, modes, seeds = {}, {}, {}
    for key in keys:
        c = key["condition"]
        if c["condition"] == "baseline":
            continue
        spec = c["heads"] if c["condition"] == "heads" else f"{c['condition']}:{c['n_heads']}"
        sets[spec] = modes[c["mode"]] = None
        if c["condition"] == "random":
            seeds[c["seed"]] = None
    settings = s.to_dict() | {
        "heads": list(sets),
        "modes": list(modes),
        "seeds": sorted(seeds) if seeds else s.seeds,
        "tasks": list(dict.fromkeys(k["task"] for k in keys)),
        "lengths": sorted({k["length"] for k in keys}),
    }
    settings.pop(NEEDLES_CONTENT, None)  # a needles file's content, as the needle items held were made with
    needle = next((k for k in keys if k["task"] == NEEDLE_TASK and NEEDLES_CONTENT in k), None)
    return settings | ({NEEDLES_CONTENT: needle[NEEDLES_CONTENT]} if needle else {})


def item_key(
    s: AblateSettings, path: Path, model: HookedModel, wrapper: Wrapper, c: Condition, task: str, length: int
) -> dict[str, Any]:
    """What decides one item's answers: the model, the prompts (task, length, needles (a file by its content
    too), depths, samples, seed, wrapper, budget) and the condition (its heads and mode)."""
    return resume_key(
        checkpoint=str(path.resolve()), dtype=s.dtype, prompt_start=model.prompt_start, wrapper=wrapper.template,
        task=task, length=length, needles=s.needles, depths=s.depths if task == NEEDLE_TASK else None,
        samples=s.samples, seed=s.seed, max_new_tokens=s.max_new_tokens, condition=c.columns(),
        **(s.files() if task == NEEDLE_TASK else {}),
    )  # fmt: skip


def ablate(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: AblateSettings | None = None,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport[pd.DataFrame]:
    """Ablate the head sets of ``settings`` in every checkpoint (see the module docstring):
    :func:`headprobe.jobs.job.run_job` of an :class:`AblateJob`. Returns a
    :class:`headprobe.jobs.record.RunReport` of each model's ``ablation`` table and the failures. Bad settings
    fail the whole run before any model loads."""
    job = AblateJob(settings or AblateSettings())
    return run_job(job, checkpoints, out, device=device, memory_limit=memory_limit, progress=progress)
