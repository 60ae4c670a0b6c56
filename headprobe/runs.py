"""What every job (``analyze``, ``ruler eval``, ``shortctx eval``) shares: running over many
checkpoints with failures isolated, result-folder names, resume keys and finished parts, the run
record, library versions, the memory budget, and how progress is reported.

Progress reaches the user through the :class:`Progress` protocol: the library reports, the command
line draws (rich bars in :mod:`headprobe.cli.progress`); the library itself draws nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pandas as pd
import torch

from headprobe.core.atomic import FolderBusy, atomic_write_text, folder_lock
from headprobe.core.errors import HeadprobeError, SettingError
from headprobe.core.ranks import Ranks
from headprobe.hooked.load import model_name
from headprobe.model.budget import MemoryEstimate
from headprobe.results import Schema, TableMeta, collect, read_meta, read_table, write_table

T = TypeVar("T")
RUN_FILE = "run.json"


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------
class Progress(Protocol):
    """How long work reports itself. ``start`` sets the amount of work, ``advance`` counts finished units,
    ``describe`` says what is being worked on, ``log`` reports a line (e.g. a skipped item)."""

    def start(self, total: int, description: str = "") -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def describe(self, description: str) -> None: ...

    def log(self, message: str) -> None: ...


class Silent:
    """A :class:`Progress` that reports nothing (the default of every library call)."""

    def start(self, total: int, description: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def describe(self, description: str) -> None:
        pass

    def log(self, message: str) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# Names, versions, keys
# ---------------------------------------------------------------------------------------------
def checkpoint_name(path: str | Path) -> str:
    """The results sub-folder of a checkpoint: its one name (:func:`headprobe.hooked.model_name`), the name
    its loaded model, logs and errors use too (``runs/grid/toy-d16/s0/pt/final`` -> ``toy-d16-s0-pt-final``)."""
    return model_name(path)


def unique_names(checkpoints: Sequence[str | Path]) -> list[str]:
    """:func:`checkpoint_name` of each checkpoint; raises when two would share a results folder."""
    names = [checkpoint_name(c) for c in checkpoints]
    if len(set(names)) < len(names):
        raise SettingError(f"two checkpoints would share a results folder: {names}; run them separately")
    return names


def versions() -> dict[str, str]:
    """Versions of Python and the libraries that decide the numbers."""
    import importlib.metadata as md

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("headprobe", "transformers", "transformer-lens"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out


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


def resume_key(**fields: Any) -> dict[str, Any]:
    """A resume key: the values that decide a work item's numbers, in the form they take in JSON (so a
    key read back from a file compares equal to a freshly made one)."""
    return json.loads(json.dumps(fields, default=str))


def table_meta(
    table: str, model: str | None, checkpoint: str | Path | None, settings: dict[str, Any], **kw
) -> TableMeta:
    """A :class:`TableMeta` with this process's command and library versions."""
    return TableMeta(
        table=table,
        model=model,
        checkpoint=None if checkpoint is None else str(checkpoint),
        settings=resume_key(**settings),
        command=list(sys.argv),
        versions=versions(),
        **kw,
    )


def write_results(
    folder: Path,
    model: str,
    checkpoint: str | Path,
    settings: dict[str, Any],
    tables: Sequence[tuple[Schema, pd.DataFrame]],
    facts: dict[str, Any] | None = None,
) -> None:
    """Write each ``(schema, frame)`` as ``folder/<table>.parquet`` with this run's metadata (``facts``: what
    the model declared, :meth:`headprobe.hooked.HookedModel.facts`), and with a ``model`` column (``model``
    where the frame has none): every table of a results folder names the model its rows describe (the
    contract of :func:`headprobe.results.collect`), however the frame was made."""
    for schema, frame in tables:
        if "model" not in frame.columns:  # e.g. a table combined from per-sample parts (retrieval's)
            frame = frame.assign(model=model)
        meta = table_meta(schema.table, model, checkpoint, settings, model_facts=facts or {})
        write_table(folder / f"{schema.table}.parquet", frame, meta, schema)


class Parts:
    """The finished work items of one model's job: ``<folder>/parts/<table>-<item>.parquet``, each carrying
    the resume key that produced it. A rerun skips items whose key matches and redoes the rest; an
    interrupted run leaves the finished parts and nothing half-written."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / "parts"

    def path(self, table: str, item: str) -> Path:
        return self.folder / f"{table}-{item}.parquet"

    def done(self, table: str, item: str, key: dict[str, Any]) -> bool:
        meta = read_meta(self.path(table, item))
        return meta is not None and meta.key == key

    def write(self, table: Schema, item: str, frame: pd.DataFrame, meta: TableMeta) -> None:
        write_table(self.path(table.table, item), frame, meta, table)

    def differences(self, keys: Sequence[dict[str, Any]], free: Sequence[str]) -> dict[str, tuple[Any, Any]]:
        """What the finished parts were made from that ``keys`` (this run's, one per work item) would change:
        ``{field: (the part's value, this run's)}`` for each field, other than the ``free`` ones (those a
        rerun may vary: the metric, the length ...), in which a part's key differs from this run's key of
        the same metric (of any metric when this run has none); empty when every part fits this run."""
        by_metric = {k.get("metric"): k for k in keys}
        found: dict[str, tuple[Any, Any]] = {}
        for path in sorted(self.folder.glob("*.parquet")) if keys else []:
            meta = read_meta(path)
            if meta is None or meta.key is None:
                continue
            new = by_metric.get(meta.key.get("metric"), keys[0])
            for name in sorted(set(meta.key) & set(new) - set(free)):
                if meta.key[name] != new[name]:
                    found.setdefault(name, (meta.key[name], new[name]))
        return found

    def gather(self, table: str, items: Sequence[str]) -> pd.DataFrame:
        """The parts of ``items`` in order, concatenated."""
        return pd.concat([read_table(self.path(table, i)).frame for i in items], ignore_index=True)


# ---------------------------------------------------------------------------------------------
# Many checkpoints
# ---------------------------------------------------------------------------------------------
class DoesNotFit(HeadprobeError, RuntimeError):
    """A run would not fit in the memory budget; the message gives the estimate and what to change."""


# errors that fail one checkpoint of a job but not the others (anything else is a bug and propagates)
CHECKPOINT_ERRORS: tuple[type[Exception], ...] = (HeadprobeError, FileNotFoundError)


@dataclass
class RunReport(Generic[T]):
    """What a job over several checkpoints produced.

    Attributes:
        results: each checkpoint's result by name (its results sub-folder).
        errors: the failed checkpoints' messages by name.
        checkpoints: every checkpoint's path by name.
        out: the results folder; :meth:`table` reads one table over every model in it.
        primary: whether this process wrote the results (``False`` on the other processes of a
            ``torchrun`` launch, whose ``results`` are placeholders; :mod:`headprobe.core.ranks`).
    """

    results: dict[str, T] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    checkpoints: dict[str, str] = field(default_factory=dict)
    out: Path | None = None
    primary: bool = True  # False on a torchrun launch's other processes (:mod:`headprobe.core.ranks`)

    def table(self, name: str) -> pd.DataFrame:
        """Table ``name`` of every model of this run (:func:`headprobe.results.collect`)."""
        if self.out is None:
            raise ValueError("this run wrote no results folder")
        return collect(self.out, name)


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
    for ckpt, name in zip(checkpoints, unique_names(checkpoints), strict=True):
        report.checkpoints[name] = str(ckpt)
        try:
            report.results[name] = job(Path(ckpt), name)
        except CHECKPOINT_ERRORS as err:
            report.errors[name] = str(err)
            on_error(name)
    return report


class FolderOfAnotherCommand(FolderBusy):
    """The output folder holds another command's run (its ``run.json`` names another job)."""


@contextlib.contextmanager
def job_folder(out: Path, job: str) -> Iterator[None]:
    """Hold ``out`` for one run of ``job`` (:func:`folder_lock`), refusing a folder whose run record
    (``OUT/run.json``) is another command's: each command's results and record stay its own."""
    with folder_lock(out):
        record = Path(out) / RUN_FILE
        if record.is_file():
            try:
                other = json.loads(record.read_text(encoding="utf-8")).get("job")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                other = "an unknown command"
            if other != job:
                raise FolderOfAnotherCommand(
                    f"{out} holds the results of `headprobe {other}` ({record}); give `headprobe {job}` another `out`"
                )
        yield


def run_models(
    checkpoints: Sequence[str | Path],
    out: Path,
    job: Callable[[Path, Path, str], T],
    progress: Progress,
    record: tuple[str, dict[str, Any]],
    ranks: Ranks | None = None,
) -> RunReport[T]:
    """``job(path, folder, name)`` for every checkpoint, each writing into ``out/<name>/`` (however many
    there are, so that adding a checkpoint to a run never moves the results already there). One
    checkpoint's failure is the run's; of several, a failure is recorded and the others run. ``record`` is
    the job's name and settings for ``OUT/run.json`` (written when anything succeeded). The run holds
    ``out`` (:func:`folder_lock`) throughout; with ``ranks`` of several processes, the first holds it and
    writes the record."""
    names, ranks = unique_names(checkpoints), ranks or Ranks()
    with ranks.held_by_main(job_folder(out, record[0])):
        if len(checkpoints) == 1:
            report: RunReport[T] = RunReport(checkpoints={names[0]: str(checkpoints[0])}, out=out)
            report.results[names[0]] = job(Path(checkpoints[0]), out / names[0], names[0])
        else:
            report = run_each(checkpoints, lambda path, name: job(path, out / name, name), progress, out)
        report.primary = ranks.is_main
        if report.results and ranks.is_main:
            write_run_record(out, record[0], record[1], report)
    return report


def write_run_record(out: Path, job: str, settings: dict[str, Any], report: RunReport[Any]) -> None:
    """``OUT/run.json``: the job, its settings, command, versions, checkpoints and failures."""
    record = {
        "job": job,
        "command": list(sys.argv),
        "settings": resume_key(**settings),
        "versions": versions(),
        "checkpoints": report.checkpoints,
        "errors": report.errors,
    }
    atomic_write_text(out / RUN_FILE, json.dumps(record, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------
def available_memory(device: torch.device | str) -> int:
    """Free bytes on ``device``: free GPU memory, or the host's available memory."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


USABLE = 0.9  # the share of the budget a run may plan to use


@dataclass(frozen=True)
class MemoryBudget:
    """The bytes a run may use: the ``memory_limit`` given (``limited``), else what the device has free."""

    bytes: int
    limited: bool = False

    @classmethod
    def of(cls, device: torch.device | str, memory_limit: int | None) -> MemoryBudget:
        return cls(memory_limit, True) if memory_limit else cls(available_memory(device))

    def __str__(self) -> str:
        gib = f"{self.bytes / 2**30:.3g} GiB"
        return f"`memory_limit` allows only {gib}" if self.limited else f"only {gib} is available"

    def fix(self, fix: str) -> str:
        """``fix`` (what to change to need less), with raising the limit first when one was given."""
        return f"raise `memory_limit`, or {fix}" if self.limited else f"{fix}, or use a larger machine"


def require_fits(what: str, estimate: MemoryEstimate, budget: MemoryBudget, fix: str) -> None:
    """Raise :class:`DoesNotFit` when ``estimate`` exceeds the usable share of ``budget``; ``fix`` says how
    to need less."""
    if estimate.total > USABLE * budget.bytes:
        raise DoesNotFit(f"{what} needs about {estimate.describe()}, but {budget}; {budget.fix(fix)}")
