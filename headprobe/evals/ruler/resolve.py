"""A RULER-style evaluation's settings made concrete, once per run and before any model loads
(:func:`resolve_run`, giving a :class:`RulerRun`): with ``data``, the lengths (and, for all tasks, the tasks) the
file holds unless given, and its samples; else the default length. Importable without torch, as the settings
are."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from headprobe.evals.ruler.samples import read_samples, skipped_tasks
from headprobe.evals.ruler.settings import RulerError, RulerSettings
from headprobe.evals.ruler.tasks import TASKS, Task

DEFAULT_LENGTH = 4096


@dataclass
class RulerRun:
    """Settings made concrete by :func:`resolve_run`.

    Attributes:
        settings: the settings with their lengths and task names filled in (recorded with the results).
        tasks: the tasks asked for.
        samples: the samples of ``settings.data`` to evaluate, or ``None``: generate them for each model.
    """

    settings: RulerSettings
    tasks: list[Task]
    samples: list[dict[str, Any]] | None


def resolve_run(settings: RulerSettings) -> RulerRun:
    """``settings`` made concrete, with the samples of ``data`` when given: the lengths (and, for
    all tasks, the tasks) it holds unless given. Raises, naming what the file holds, when a length or
    task asked for has no samples there; reads no model."""
    tasks = settings.validate()
    if not settings.data:
        return RulerRun(replace(settings, lengths=settings.lengths or [DEFAULT_LENGTH]), tasks, None)
    rows = read_samples(settings.data)
    held = {x["task"] for x in rows} | {t for ts in skipped_tasks(rows).values() for t in ts}
    every = len(tasks) == len(TASKS)
    absent = [t.name for t in tasks if t.name not in held and not every]
    tasks = [t for t in tasks if t.name in held]  # all tasks asked for: those the file holds
    names = [t.name for t in tasks]
    chosen = [x for x in rows if x["task"] in names and x["index"] < settings.samples]
    present = sorted({int(x["length"]) for x in chosen})
    lengths = settings.lengths or present
    missing = [n for n in lengths if n not in present]
    if absent or missing or not lengths:
        what = "any RULER task" if every else f"`tasks` {', '.join(absent or names)}"
        at = f" at `lengths` {', '.join(f'{n:,}' for n in missing)}" if missing and not absent else ""
        raise RulerError(
            f"`data` {settings.data} holds no samples of {what}{at}; it holds {_holdings(rows)}; choose `tasks` "
            "and `lengths` among those (without `lengths`, the lengths it holds are evaluated)"
        )
    concrete = replace(settings, tasks=names, lengths=lengths)
    return RulerRun(concrete, tasks, [x for x in chosen if x["length"] in lengths])


def _holdings(rows: list[dict[str, Any]]) -> str:
    """What a sample file holds, in words: its lengths and tasks, and the tasks it skipped."""
    lengths = ", ".join(f"{n:,}" for n in sorted({int(x["length"]) for x in rows}))
    names = list(dict.fromkeys(x["task"] for x in rows))
    skips = "".join(f"; at {n:,} it skipped {', '.join(ts)}" for n, ts in skipped_tasks(rows).items())
    return f"{len(rows)} samples at lengths {lengths or 'none'} of tasks {', '.join(names) or 'none'}{skips}"
