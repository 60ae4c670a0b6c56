"""An output folder held for one job: :func:`job_folder` (one run of a job that writes its results there:
claimed, locked, marked as the job's at once) and :func:`held_folder` (a job whose steps write into it, a study
or the real-model demo: claimed, marked, its runs recorded); a folder a refused or failed run left holding
nothing is taken back."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from headprobe.core.atomic import LOCK_FILE, atomic_write_text, folder_lock, missing_folders, remove_if_empty
from headprobe.core.outputs import RUN_FILE, claim, command_of, job_results
from headprobe.core.resume import resume_key
from headprobe.jobs.record import merged_settings, read_record


@contextlib.contextmanager
def job_folder(out: Path, job: str, inputs: Sequence[str | Path] = ()) -> Iterator[None]:
    """Hold ``out`` for one run of ``job`` (:func:`headprobe.core.atomic.folder_lock`) once
    :func:`headprobe.core.outputs.claim` allows it: a new or empty folder, or ``job``'s own results; never
    another command's results, a checkpoint, a training run or other files, and never one of the ``inputs``
    or a folder around or inside one. A new folder's record (``OUT/run.json``, naming the job) is written at
    once, so that an interrupted first run is known as ``job``'s on the rerun, and taken back when the run
    wrote nothing."""
    claim(out, job_results(job), inputs=inputs, fix=f"give `{command_of(job)}` another `out`")
    with folder_lock(out):
        record, marker = Path(out) / RUN_FILE, json.dumps({"job": job}, indent=2) + "\n"
        marked = not record.exists()
        if marked:
            atomic_write_text(record, marker)
        try:
            yield
        finally:
            alone = not any(p.name not in (RUN_FILE, LOCK_FILE) for p in Path(out).iterdir())
            if marked and alone and record.read_text(encoding="utf-8") == marker:
                record.unlink()  # a refused or failed run writes nothing


@contextlib.contextmanager
def held_folder(
    out: Path, job: str, record: dict[str, Any] | None = None, inputs: Sequence[str | Path] = ()
) -> Iterator[None]:
    """Hold ``out`` for a ``job`` whose steps write into it (a study, the real-model demo): claim it
    (:func:`headprobe.core.outputs.claim`: a new or empty folder, or ``job``'s own results; never one of the
    ``inputs`` or around or inside one) and mark it at once (``OUT/run.json`` naming the job), so that it is
    known as ``job``'s from its first step on. A folder the block left holding nothing but that mark is taken
    back (a refused or failed run writes nothing); otherwise, with a ``record`` (what this run was asked:
    recipe, seeds ...), the record lists it under ``runs`` and its lists (seeds ...) hold every run's."""
    claim(out, job_results(job), inputs=inputs, fix=f"give `{command_of(job)}` another `out`")
    path, created = Path(out) / RUN_FILE, missing_folders(out)
    marked = not path.exists()
    if marked:
        atomic_write_text(path, json.dumps({"job": job}, indent=2) + "\n")
    try:
        yield
    finally:
        alone = not any(p.name not in (RUN_FILE, LOCK_FILE) for p in Path(out).iterdir())
        if marked and alone:
            path.unlink(missing_ok=True)
            remove_if_empty(created)
        elif record is not None:
            earlier = read_record(path, job)
            run = {**resume_key(**record), "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
            runs = [*earlier.get("runs", []), run]
            merged = merged_settings(
                earlier, resume_key(**record), [k for k, v in record.items() if isinstance(v, list)]
            )
            atomic_write_text(path, json.dumps({"job": job, **merged, "runs": runs}, indent=2) + "\n")
