"""Resuming a job: the resume key that decides a work item's numbers (:func:`resume_key`), and what a rerun
says: the work it skips (:func:`done_earlier`), a setting's value in a refusal (:func:`shown_value`), and
the refusals of lengths named twice (:func:`repeated_lengths`) and of input files changed since
(:func:`changed_inputs`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def resume_key(**fields: Any) -> dict[str, Any]:
    """A resume key: the values that decide a work item's numbers, in the form they take in JSON (so a
    key read back from a file compares equal to a freshly made one)."""
    return json.loads(json.dumps(fields, default=str))


def repeated_lengths(lengths: Sequence[int]) -> str | None:
    """The refusal of a job's ``lengths`` that name a length twice (its items and parts would collide),
    naming the repeats; ``None`` when each length is there once."""
    twice = sorted({n for n in lengths if list(lengths).count(n) > 1})
    return f"`lengths` lists {', '.join(map(str, twice))} more than once; give each length once" if twice else None


def done_earlier(what: str, done: int, total: int) -> str:
    """The line a rerun logs for work it skips: ``what`` (a model, metric or task at a length) and how much
    of it (``done`` of ``total`` samples) was finished by an earlier run."""
    part = "done earlier" if done == total else f"{done} of {total} samples done earlier"
    return f"{what}: {part}, skipped"


NONE_MEANS = {"dtype": "as saved"}  # what a setting left out (None) means, where a message names it


def shown_value(name: str, value: Any) -> str:
    """A setting's value as a message shows it: ``None`` as what it means (``--dtype`` as saved), anything else
    as Python writes it."""
    return NONE_MEANS.get(name, "not given") if value is None else repr(value)


def changed_inputs(files: Sequence[str], folder: Path) -> str:
    """The refusal of a rerun into ``folder`` whose input ``files`` changed since its results were made
    (:func:`headprobe.core.paths.changed_files`): they would be read apart from, or pooled with, results of
    the files' earlier content."""
    its, it = ("its", "it") if len(files) == 1 else ("their", "them")
    return (
        f"{' and '.join(files)} changed since these results were made ({folder} holds results of {its} earlier "
        f"content); restore {it}, give another `out` for the new content, or delete {folder} to redo them"
    )
