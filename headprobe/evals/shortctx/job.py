"""``headprobe shortctx eval``: multiple-choice accuracy of one or more models, as tidy tables.

For each model, in ``OUT/<name>/`` (however many there are): ``shortctx_items.parquet`` (one row
per item: label, predictions, the choices' log-likelihoods) and the derived ``shortctx_scores.parquet``
(``acc`` and ``acc_norm``). A rerun with the same settings reuses the finished items (``parts/``);
``OUT/run.json`` records the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from headprobe.core.paths import CONTENT
from headprobe.core.progress import Progress
from headprobe.core.resume import done_earlier
from headprobe.evals.shortctx.items import Item, ShortCtxError
from headprobe.evals.shortctx.scoring import evaluate_items
from headprobe.evals.shortctx.settings import ShortCtxSettings
from headprobe.hooked import load_model, parse_dtype
from headprobe.jobs.job import Env, Job, Plan, Target, run_job
from headprobe.jobs.parts import Parts, check_parts
from headprobe.jobs.provenance import table_meta, write_results
from headprobe.jobs.record import RunReport, merged_settings
from headprobe.results import Column, Schema

SHORTCTX_ITEMS = Schema(
    "shortctx_items",
    (
        Column("model", "str"),
        Column("task", "str"),
        Column("item", "int", "the item's index in the task"),
        Column("label", "int", "the correct choice"),
        Column("pred", "int", "the choice with the largest log-likelihood"),
        Column("pred_norm", "int", "the choice with the largest log-likelihood per character"),
        Column("loglikelihoods", "list", "each choice's summed log-probability (nats)"),
    ),
)
SHORTCTX_SCORES = Schema(
    "shortctx_scores",
    (
        Column("model", "str"),
        Column("task", "str"),
        Column("metric", "str", "acc or acc_norm"),
        Column("value", "float", "0-1"),
        Column("n", "int", "items"),
    ),
)


def _item_rows(model: str, task: str, result: dict[str, Any]) -> pd.DataFrame:
    return pd.DataFrame.from_records(
        {"model": model, "task": task, "item": i, **row} for i, row in enumerate(result["items"])
    )


def scores_of(items: pd.DataFrame) -> pd.DataFrame:
    """The ``shortctx_scores`` rows of one model's ``shortctx_items``."""
    rows = []
    for (model, task), part in items.groupby(["model", "task"], sort=False):
        for metric, column in (("acc", "pred"), ("acc_norm", "pred_norm")):
            rows.append((model, task, metric, float((part[column] == part["label"]).mean()), len(part)))
    return pd.DataFrame(rows, columns=SHORTCTX_SCORES.names)


class ShortCtxJob(Job[ShortCtxSettings]):
    """``headprobe shortctx eval`` (the module docstring): the task's items scored for one checkpoint, the
    finished task reused. ``batch_size`` sequences are scored together (right-padded)."""

    command = "shortctx eval"
    adds = ("task", "file", "limit")  # a rerun into a folder adds a task (its file and limit); the rest must stay

    def __init__(self, settings: ShortCtxSettings, batch_size: int = 16) -> None:
        super().__init__(settings)
        self.batch_size = max(1, batch_size)
        self.items: list[Item] = []

    def prepare(self, checkpoints: Sequence[Path]) -> None:
        self.items = self.settings.items()  # validated, and a file that does not load fails, before any model loads

    def reads(self) -> list[str | Path | None]:
        return [self.settings.file]

    def plan(self, target: Target, env: Env) -> Plan[str]:
        """The task as one item, unless a finished run with the same key did it; it finishes with the folder's
        ``shortctx_items`` (this task and those earlier runs added) and this task's ``shortctx_scores``."""
        settings, progress, name, out = self.settings, env.progress, target.name, target.folder
        model = load_model(target.path, device=env.device, dtype=parse_dtype(settings.dtype), log=progress.log)
        parts, key = Parts(out), settings.key(target.path, model.prompt_start)
        check_parts(parts, [key], out, free=("task",), by="task", own=OWN)  # other tasks: added beside
        done = parts.done(SHORTCTX_ITEMS.table, settings.task, key)
        if done:
            progress.log(done_earlier(f"{name} {settings.task}", 1, 1))

        def do(task: str) -> None:
            result = evaluate_items(model, self.items, progress=progress, batch_size=self.batch_size)
            meta = table_meta(SHORTCTX_ITEMS.table, name, target.path, settings.to_dict(), key=key)
            parts.write(SHORTCTX_ITEMS, task, _item_rows(name, task, result), meta)

        def finish() -> pd.DataFrame:
            held = parts.keys(SHORTCTX_ITEMS.table)  # this task and those earlier runs added to the folder
            tasks = [settings.task, *sorted(t for t in held if t != settings.task and held[t] is not None)]
            table = parts.gather(SHORTCTX_ITEMS.table, tasks)
            scores = scores_of(table)
            earlier = {k: [held[t][k] for t in tasks] for k in self.adds}
            described = merged_settings(earlier, settings.to_dict(), self.adds)
            described.pop(FILE_CONTENT, None)  # every task's file by its content, as its items were made
            files = {path: digest for t in tasks for path, digest in (held[t].get(FILE_CONTENT) or {}).items()}
            described |= {FILE_CONTENT: files} if files else {}
            write_results(out, name, target.path, described, ((SHORTCTX_ITEMS, table), (SHORTCTX_SCORES, scores)))
            return scores[scores["task"] == settings.task].reset_index(drop=True)

        return Plan([] if done else [settings.task], do, finish, names=lambda task: [task], error=ShortCtxError)


FILE_CONTENT = f"file{CONTENT}"  # the task file's content, in the keys and settings
OWN = ("file", FILE_CONTENT, "limit")  # each task's own: another task's differ freely


def evaluate_many(
    checkpoints: Sequence[str | Path],
    out: str | Path,
    settings: ShortCtxSettings,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
    batch_size: int = 16,
) -> RunReport[pd.DataFrame]:
    """Every checkpoint, into ``out/<name>/`` each (:func:`headprobe.jobs.job.run_job` of a
    :class:`ShortCtxJob`); a failing checkpoint is reported and the others still run. Returns each model's
    ``shortctx_scores`` of this task."""
    job = ShortCtxJob(settings, batch_size)
    return run_job(job, checkpoints, out, device=device, memory_limit=memory_limit, progress=progress)
