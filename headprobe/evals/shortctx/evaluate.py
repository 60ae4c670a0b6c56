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
from headprobe.core.progress import Progress, Silent
from headprobe.core.resume import done_earlier
from headprobe.evals.shortctx.scoring import evaluate_items
from headprobe.evals.shortctx.settings import ShortCtxSettings
from headprobe.hooked import load_model, parse_dtype
from headprobe.jobs.checkpoints import checkpoint_name, run_models
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


def evaluate(
    checkpoint: str | Path,
    out: str | Path,
    settings: ShortCtxSettings,
    *,
    device: str = "cpu",
    batch_size: int = 16,
    progress: Progress | None = None,
    name: str | None = None,
) -> pd.DataFrame:
    """Score the task's items (reusing a finished run with the same key); returns ``shortctx_scores``."""
    out, name = Path(out), name or checkpoint_name(checkpoint)
    items = settings.items()
    model = load_model(checkpoint, device=device, dtype=parse_dtype(settings.dtype), log=(progress or Silent()).log)
    parts, key = Parts(out), settings.key(checkpoint, model.prompt_start)
    check_parts(parts, [key], out, free=("task",), by="task", own=OWN)  # other tasks: added beside
    meta = table_meta(SHORTCTX_ITEMS.table, name, checkpoint, settings.to_dict(), key=key)
    if parts.done(SHORTCTX_ITEMS.table, settings.task, key):
        (progress or Silent()).log(done_earlier(f"{name} {settings.task}", 1, 1))
    else:
        result = evaluate_items(model, items, progress=progress or Silent(), batch_size=max(1, batch_size))
        parts.write(SHORTCTX_ITEMS, settings.task, _item_rows(name, settings.task, result), meta)
    held = parts.keys(SHORTCTX_ITEMS.table)  # this task and those earlier runs added to the folder
    tasks = [settings.task, *sorted(t for t in held if t != settings.task and held[t] is not None)]
    table = parts.gather(SHORTCTX_ITEMS.table, tasks)
    scores = scores_of(table)
    described = merged_settings({k: [held[t][k] for t in tasks] for k in ADDS}, settings.to_dict(), ADDS)
    described.pop(FILE_CONTENT, None)  # every task's file by its content, as its items were made
    files = {path: digest for t in tasks for path, digest in (held[t].get(FILE_CONTENT) or {}).items()}
    described |= {FILE_CONTENT: files} if files else {}
    write_results(out, name, checkpoint, described, ((SHORTCTX_ITEMS, table), (SHORTCTX_SCORES, scores)))
    return scores[scores["task"] == settings.task].reset_index(drop=True)


ADDS = ("task", "file", "limit")  # a rerun into a folder adds a task (its file and limit); the rest must stay
FILE_CONTENT = f"file{CONTENT}"  # the task file's content, in the keys and settings
OWN = ("file", FILE_CONTENT, "limit")  # each task's own: another task's differ freely


def evaluate_many(
    checkpoints: Sequence[str | Path], out: str | Path, settings: ShortCtxSettings, **kwargs: Any
) -> RunReport[pd.DataFrame]:
    """:func:`evaluate` for each checkpoint, into ``out/<name>/`` each; a failing checkpoint is reported and
    the others still run."""
    settings.items()  # bad settings fail once, before any checkpoint is loaded

    def job(path: Path, folder: Path, name: str) -> pd.DataFrame:
        return evaluate(path, folder, settings, name=name, **kwargs)

    progress = kwargs.get("progress") or Silent()
    return run_models(
        checkpoints, Path(out), job, progress, ("shortctx eval", settings.to_dict()), adds=ADDS, reads=[settings.file]
    )
