"""One shape for every command that runs models over checkpoints (``analyze``, ``ruler eval``, ``ablate``,
``shortctx eval``): a :class:`Job` says what it does to one checkpoint, :func:`run_job` does the rest.

A job is a settings dataclass (with ``validate`` and ``to_dict``), a :meth:`Job.plan` for one checkpoint
and the tables it writes. The plan loads the model, refuses what cannot work (lengths, memory, a results
folder of other settings), builds the resume keys once and lists the work items still to do; it says how
to do one item (which writes its resumable part) and how to finish (the tables, from every finished part).
:func:`run_job` does, once for the whole run and in this order:

1. :meth:`Job.prepare`: the settings validated (bad settings fail the run before anything is read), with
   the checks and choices that hold for every checkpoint (e.g. RULER samples resolved, heads ranked from an
   earlier table), before any model loads;
2. each checkpoint's lengths checked against what it was trained on
   (:func:`headprobe.hooked.check_trained_lengths`): beyond it, the whole run fails before any model loads,
   unless ``allow_beyond_trained`` (then the checkpoint's turn logs the warning);
3. the processes of a ``torchrun`` launch (:mod:`headprobe.core.ranks`): each checkpoint's items are shared
   among them from outside the job (:func:`share`), and the first process finishes;
4. :func:`headprobe.jobs.checkpoints.run_models`: one results folder per checkpoint, one checkpoint's
   failure isolated from the others, ``OUT/run.json``.

Adding a command is a settings class, a :class:`Job` subclass and a table schema (docs/index.md, "Adding a
command").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import pandas as pd

from headprobe.core.errors import HeadprobeError
from headprobe.core.progress import Progress, Silent
from headprobe.core.ranks import Ranks
from headprobe.hooked import check_trained_lengths
from headprobe.jobs.checkpoints import CHECKPOINT_ERRORS, run_models
from headprobe.jobs.record import RunReport

I = TypeVar("I")  # a work item


class JobSettings(Protocol):
    """What :func:`run_job` needs of a job's settings dataclass."""

    def validate(self) -> None: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Target:
    """One checkpoint of a run: its ``path``, its ``name`` (:func:`headprobe.jobs.checkpoints.checkpoint_name`)
    and its results ``folder`` (``OUT/<name>``)."""

    path: Path
    name: str
    folder: Path


@dataclass(frozen=True)
class Env:
    """Where and how a run computes: ``device`` (this process's: ``cuda:LOCAL_RANK`` under ``torchrun``),
    ``memory_limit`` in bytes (``None``: what the device has), ``progress`` (silent on every process but the
    first), ``ranks``: the processes that share the items (:func:`share` deals them out; a plan may cut its
    items finer when there are several, and names its own files after its rank)."""

    device: str = "cpu"
    memory_limit: int | None = None
    progress: Progress = field(default_factory=Silent)
    ranks: Ranks = field(default_factory=Ranks)


@dataclass
class Plan(Generic[I]):
    """One checkpoint's work, decided before any of it is done (the same on every process).

    Attributes:
        items: the work items still to do, in order.
        do: computes one item and writes its resumable part.
        finish: the checkpoint's result table, from every finished part (the first process only, once every
            item is done).
        names: an item's units of work as the item log names them (``$HEADPROBE_LOG_ITEMS``,
            :meth:`Ranks.did`): the same units whichever way the items cut them, one process or several.
        units: an item's share of the progress bar (1 by default).
        error: what the other processes raise when one fails (the job's own error class).
    """

    items: Sequence[I]
    do: Callable[[I], None]
    finish: Callable[[], pd.DataFrame]
    names: Callable[[I], Sequence[str]] = lambda item: [str(item)]
    units: Callable[[I], int] = lambda item: 1
    error: type[Exception] = HeadprobeError


S = TypeVar("S", bound=JobSettings)


class Job(ABC, Generic[S]):
    """A command that runs models over checkpoints (see the module docstring).

    Attributes:
        command: the job's name in ``OUT/run.json`` and in messages (``analyze``, ``ruler eval``).
        adds: the list settings a rerun into a folder adds to (analyze's ``metrics`` and ``lengths``).
        settings: the settings, validated once, by :meth:`prepare`.
    """

    command: ClassVar[str]
    adds: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: S) -> None:
        self.settings = settings

    def lengths(self) -> Sequence[int]:
        """The prompt lengths (tokens) every checkpoint must have been trained on."""
        return getattr(self.settings, "lengths", None) or []

    def allow_beyond_trained(self) -> bool:
        """Whether lengths beyond training are a warning instead of a refusal."""
        return bool(getattr(self.settings, "allow_beyond_trained", False))

    def reads(self) -> Sequence[str | Path | None]:
        """The input files besides the checkpoints (a results folder must not hold or lie in them)."""
        return []

    def prepare(self, checkpoints: Sequence[Path]) -> None:
        """The settings validated, with the checks and choices for the whole run, before any model loads (by
        default the validation alone; a job that validates on the way, e.g. while resolving its settings,
        does it there instead of twice)."""
        self.settings.validate()

    def units(self, checkpoints: int) -> int | None:
        """The progress bar's total for ``checkpoints`` checkpoints when it is known before any model loads
        (``None``: each plan starts its own)."""
        return None

    @abstractmethod
    def plan(self, target: Target, env: Env) -> Plan[Any]:
        """Load ``target``'s model, refuse what cannot work, build the resume keys and list the items still
        to do."""


def share(plan: Plan[Any], env: Env, name: str, deal: int = 0) -> pd.DataFrame:
    """Do ``plan``'s items, each process of ``env.ranks`` its share (:meth:`Ranks.mine`: item ``i`` to the
    process ``(deal + i) mod N``), and finish on the first process; the others return an empty frame. When
    any process fails, every process raises (:meth:`Ranks.together`). ``deal``: the checkpoint's place in
    the run, so that plans of one item each (a short-context task) go to the processes in turn."""
    ranks, progress = env.ranks, env.progress
    ranks.barrier()  # every process has the same plan before any of them writes a part
    with ranks.together(CHECKPOINT_ERRORS, plan.error):
        for index, item in enumerate(plan.items):
            if ranks.mine(deal + index):  # another process's item otherwise
                plan.do(item)
                for unit in plan.names(item):
                    ranks.did(f"{name} {unit}")
    if not ranks.is_main:
        return pd.DataFrame()
    progress.advance(ranks.others([plan.units(item) for item in plan.items], deal))
    return plan.finish()


def run_one(job: Job[Any], target: Target, env: Env | None = None) -> pd.DataFrame:
    """One checkpoint of a prepared ``job`` (its settings valid, :meth:`Job.prepare` done) into
    ``target.folder``, without a run record: its lengths checked against what it was trained on, its plan
    done (by the processes of ``env.ranks``: one by default). :func:`run_job` is this for many checkpoints,
    with every check made before any model loads."""
    env = env or Env()
    warning = check_trained_lengths(target.path, job.lengths(), job.allow_beyond_trained())
    if warning:
        env.progress.log(f"{target.name}: {warning}")
    return share(job.plan(target, env), env, target.name)


def run_job(
    job: Job[Any],
    checkpoints: Sequence[str | Path],
    out: str | Path,
    *,
    device: str = "cpu",
    memory_limit: int | None = None,
    progress: Progress | None = None,
) -> RunReport[pd.DataFrame]:
    """Run ``job`` over every checkpoint (see the module docstring), each into ``out/<name>/``; returns each
    checkpoint's result table and the failures. ``memory_limit``: bytes (``None``: what the device has)."""
    paths = [Path(c) for c in checkpoints]
    job.prepare(paths)
    warnings = {}
    for path in paths:  # lengths beyond training fail the whole run before any model loads
        warnings[path] = check_trained_lengths(path, job.lengths(), job.allow_beyond_trained())
    ranks = Ranks.from_env()  # several processes under torchrun: each takes its share of every checkpoint's items
    env = Env(ranks.device(device), memory_limit, (progress or Silent()) if ranks.is_main else Silent(), ranks)
    total = job.units(len(paths))
    if total is not None:
        env.progress.start(total, job.command)

    def one(path: Path, folder: Path, name: str) -> pd.DataFrame:
        if warnings.get(path):
            env.progress.log(f"{name}: {warnings[path]}")
        return share(job.plan(Target(path, name, folder), env), env, name, deal=paths.index(path))

    record = (job.command, job.settings.to_dict())
    return run_models(checkpoints, Path(out), one, env.progress, record, ranks, adds=job.adds, reads=job.reads())
