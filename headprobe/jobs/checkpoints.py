"""A job over many checkpoints: each one's results folder, named once (:func:`checkpoint_name`,
:func:`unique_names`), and the job run for each of them, one checkpoint's failure isolated from the others
(:func:`run_models`, :func:`run_each`, :data:`CHECKPOINT_ERRORS`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from headprobe.core.errors import HeadprobeError, SettingError
from headprobe.core.progress import Progress
from headprobe.core.ranks import Ranks
from headprobe.hooked.load import model_name
from headprobe.jobs.folders import job_folder
from headprobe.jobs.record import RunReport, write_run_record

T = TypeVar("T")

# errors that fail one checkpoint of a job but not the others (anything else is a bug and propagates)
CHECKPOINT_ERRORS: tuple[type[Exception], ...] = (HeadprobeError, FileNotFoundError)


def checkpoint_name(path: str | Path) -> str:
    """The results sub-folder of a checkpoint: its one name (:func:`headprobe.hooked.model_name`), the name
    its loaded model, logs and errors use too (``runs/grid/toy-d16/s0/pt/final`` -> ``toy-d16-s0-pt-final``)."""
    return model_name(path)


def unique_names(checkpoints: Sequence[str | Path], out: Path | None = None) -> list[str]:
    """:func:`checkpoint_name` of each checkpoint; raises, naming both paths, when two would share a results
    folder (in ``out``)."""
    names = [checkpoint_name(c) for c in checkpoints]
    for i, name in enumerate(names):
        if name in names[:i]:
            first = checkpoints[names.index(name)]
            folder = out / name if out is not None else f"OUT/{name}"
            base = out if out is not None else Path("OUT")
            if Path(first).resolve() == Path(checkpoints[i]).resolve():
                raise SettingError(
                    f"{first} and {checkpoints[i]} are the same checkpoint, and would share a results folder "
                    f"({folder}); give it once"
                )
            raise SettingError(
                f"{first} and {checkpoints[i]} would share a results folder, {folder} (both are named {name}, "
                f"after their last folders); run them one at a time, each into its own `out` (e.g. "
                f"{base.parent / (base.name + '-1')} and {base.parent / (base.name + '-2')})"
            )
    return names


def run_each(
    checkpoints: Sequence[str | Path],
    job: Callable[[Path, str], T],
    progress: Progress,
    out: Path | None = None,
    on_error: Callable[[str], None] = lambda name: None,
) -> RunReport[T]:
    """``job(path, name)`` for every checkpoint; a checkpoint that fails (it is missing, does not load,
    does not fit, has bad inputs) is recorded in ``errors`` and the others still run."""
    report: RunReport[T] = RunReport(out=out)
    for ckpt, name in zip(checkpoints, unique_names(checkpoints, out), strict=True):
        report.checkpoints[name] = str(ckpt)
        try:
            report.results[name] = job(Path(ckpt), name)
        except CHECKPOINT_ERRORS as err:
            report.errors[name] = str(err)
            on_error(name)
    return report


def run_models(
    checkpoints: Sequence[str | Path],
    out: Path,
    job: Callable[[Path, Path, str], T],
    progress: Progress,
    record: tuple[str, dict[str, Any]],
    ranks: Ranks | None = None,
    adds: Sequence[str] = (),
    reads: Sequence[str | Path | None] = (),
) -> RunReport[T]:
    """``job(path, folder, name)`` for every checkpoint, each writing into ``out/<name>/`` (however many
    there are, so that adding a checkpoint to a run never moves the results already there). One
    checkpoint's failure is the run's; of several, a failure is recorded and the others run. ``record`` is
    the job's name and settings for ``OUT/run.json`` (:func:`headprobe.jobs.record.write_run_record`, when
    anything succeeded; ``adds``: the list settings a rerun adds to, e.g. analyze's ``metrics`` and
    ``lengths``). ``out`` must not be, hold or lie inside a checkpoint or another path the job ``reads`` (a
    haystack file, ``from_results``). The run holds ``out`` (:func:`headprobe.jobs.folders.job_folder`)
    throughout; with ``ranks`` of several processes, the first holds it and writes the record."""
    names, ranks = unique_names(checkpoints, out), ranks or Ranks()
    inputs = [*checkpoints, *(p for p in reads if p is not None and Path(p).exists())]
    with ranks.held_by_main(job_folder(out, record[0], inputs)):
        if len(checkpoints) == 1:
            report: RunReport[T] = RunReport(checkpoints={names[0]: str(checkpoints[0])}, out=out)
            report.results[names[0]] = job(Path(checkpoints[0]), out / names[0], names[0])
        else:
            report = run_each(checkpoints, lambda path, name: job(path, out / name, name), progress, out)
        report.primary = ranks.is_main
        if report.results and ranks.is_main:
            write_run_record(out, record[0], record[1], report, adds)
    return report
