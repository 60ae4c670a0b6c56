"""The tables of ``ruler eval``: every sample's prediction and score, and the scores derived from them.

``ruler_samples``: one row per model x task x length x sample. ``ruler_scores`` (derived): RULER's
score per model x task x length (``scope = "task"``: the task's metric over its samples, 0-100, as
RULER computes it), the mean over the tasks of each length (``scope = "length"``) and the mean over the
lengths, the "RULER-style score" (``scope = "overall"``); ``n`` counts what each row averages. A task
skipped at a length (its smallest prompt does not fit, :mod:`headprobe.evals.ruler.generate`) is left out
of that length's mean, and the length's row says so: the mean is over ``n`` of ``n_tasks`` tasks, and
``skipped`` names the ones skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import pandas as pd

from headprobe.evals.ruler.tasks import Task
from headprobe.results import Column, Schema

RULER_SAMPLES = Schema(
    "ruler_samples",
    (
        Column("model", "str"),
        Column("task", "str"),
        Column("length", "int", "target length in tokens"),
        Column("sample", "int", "the sample's index"),
        Column("pred", "str", "the greedy answer, post-processed as RULER does"),
        Column("outputs", "list", "the references"),
        Column("score", "float", "the task's metric on this sample alone (0-100)"),
        Column("token_count", "int", "prompt tokens"),
        Column("fit", "str", "how its size was chosen: ruler (RULER's procedure) or tight"),
        Column("fill", "float", "prompt tokens over the budget (length - tokens to generate)"),
        Column("source", "str", "where the sample's material came from"),
        Column("haystack", "str", "which text filled it"),
        Column("prompt_format", "str", "the prompt's wrapper: plain, chat or custom (headprobe.text.prompt_format)"),
    ),
)

RULER_SCORES = Schema(
    "ruler_scores",
    (
        Column("model", "str"),
        Column("scope", "str", "task, length (mean over tasks) or overall (mean over lengths)"),
        Column("task", "str", "the task (scope task), else missing"),
        Column("length", "int", "the length (scopes task and length), else missing"),
        Column("score", "float", "0-100, rounded to 2 decimals as RULER rounds"),
        Column("n", "int", "samples (task), tasks (length) or lengths (overall) averaged"),
        Column("fit", "str", "the fits of the samples averaged (ruler, tight, or both joined by +)"),
        Column("n_tasks", "int", "the tasks asked for (scope length; of them n were scored), else missing"),
        Column("skipped", "str", "tasks skipped at the length, too long for it, comma-joined (scope length)"),
    ),
)
LABEL = "RULER-style"


def score_rows(model: str, tasks: Sequence[Task], rows: dict[str, list[dict]]) -> pd.DataFrame:
    """The ``ruler_samples`` table from the prediction rows of each ``"<task>-<length>"``."""
    by_name = {t.name: t for t in tasks}
    records = []
    for item, preds in rows.items():
        task, length = item.rsplit("-", 1)
        for r in sorted(preds, key=lambda r: r["index"]):
            records.append(
                {
                    "model": model,
                    "task": task,
                    "length": int(length),
                    "sample": r["index"],
                    "pred": r["pred"],
                    "outputs": list(r["outputs"]),
                    "score": by_name[task].metric([r["pred"]], [r["outputs"]]),
                    "token_count": r["token_count"],
                    "fit": str(r.get("fit") or "unrecorded"),
                    "fill": float(r["fill"]) if r.get("fill") is not None else float("nan"),
                    "source": str(r.get("source")),
                    "haystack": str(r.get("haystack")),
                    "prompt_format": str(r.get("prompt_format") or "unrecorded"),
                }
            )
    return pd.DataFrame.from_records(records) if records else RULER_SAMPLES.empty()


def aggregate(
    samples: pd.DataFrame, tasks: Sequence[Task], skipped: dict[int, dict[str, int]] | None = None
) -> pd.DataFrame:
    """The ``ruler_scores`` rows of one model's ``ruler_samples``; ``tasks``: those asked for, ``skipped``:
    length -> the tasks skipped there (:func:`headprobe.evals.ruler.samples.skipped_tasks`)."""
    model = samples["model"].iloc[0] if len(samples) else ""
    skipped = skipped or {}
    rows: list[tuple] = []
    for task in tasks:
        for length, part in samples[samples.task == task.name].groupby("length"):
            score = task.metric(part["pred"].tolist(), [list(o) for o in part["outputs"]])
            rows.append(("task", task.name, int(length), score, len(part), _fits(part), None, None))
    per_length = {}
    for length in sorted({r[2] for r in rows}):
        values = [r[3] for r in rows if r[2] == length]
        per_length[length] = round(sum(values) / len(values), 2)
        fits, left_out = _fits(samples[samples.length == length]), ",".join(skipped.get(length, {}))
        rows.append(("length", None, length, per_length[length], len(values), fits, len(tasks), left_out))
    if per_length:
        mean = round(sum(per_length.values()) / len(per_length), 2)
        rows.append(("overall", None, None, mean, len(per_length), _fits(samples), None, None))
    frame = pd.DataFrame(rows, columns=["scope", "task", "length", "score", "n", "fit", "n_tasks", "skipped"])
    frame.insert(0, "model", model)
    frame["length"] = frame["length"].astype("Int64")
    frame["n_tasks"] = frame["n_tasks"].astype("Int64")
    return frame


def _fits(part: pd.DataFrame) -> str:
    return "+".join(sorted(set(part["fit"]))) if "fit" in part else "unrecorded"


def overall(scores: pd.DataFrame) -> float | None:
    """The RULER-style score of a ``ruler_scores`` table of one model (``None`` when it holds none)."""
    hit = scores[scores.scope == "overall"]["score"]
    return None if hit.empty else float(hit.iloc[0])


def per_length(scores: pd.DataFrame) -> dict[int, float]:
    """Length -> mean over the tasks, of one model's ``ruler_scores``."""
    part = scores[scores.scope == "length"]
    return {int(r.length): float(r.score) for r in part.itertuples()}


class Coverage(NamedTuple):
    """What a length's mean is taken over: ``n`` of the ``n_tasks`` tasks asked for; ``skipped``: the tasks
    skipped there (too long for the length)."""

    n: int
    n_tasks: int
    skipped: list[str]


def coverage(scores: pd.DataFrame) -> dict[int, Coverage]:
    """Length -> :class:`Coverage`, of the lengths of one model's ``ruler_scores`` whose mean is not over
    every task asked for."""
    out = {}
    for r in scores[scores.scope == "length"].itertuples():
        n_tasks = getattr(r, "n_tasks", None)  # tables written before the column existed lack it
        if n_tasks is not None and not pd.isna(n_tasks) and r.n < n_tasks:
            out[int(r.length)] = Coverage(int(r.n), int(n_tasks), [t for t in str(r.skipped or "").split(",") if t])
    return out


def per_task(scores: pd.DataFrame) -> dict[str, dict[int, float]]:
    """Task -> length -> score, of one model's ``ruler_scores``."""
    out: dict[str, dict[int, float]] = {}
    for r in scores[scores.scope == "task"].itertuples():
        out.setdefault(str(r.task), {})[int(r.length)] = float(r.score)
    return out
