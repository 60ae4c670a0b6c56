"""What a run over checkpoints produced and what its results folder records of it: :class:`RunReport` (each
checkpoint's result and failure), and ``OUT/run.json``, the run record (:func:`write_run_record`: every run's
command, settings, versions, checkpoints and failures; :func:`merged_settings`, the settings of a folder that
several runs wrote; :func:`read_record`)."""

from __future__ import annotations

import datetime as _dt
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import pandas as pd

from headprobe.core.atomic import atomic_write_text
from headprobe.core.outputs import RUN_FILE
from headprobe.core.resume import resume_key
from headprobe.jobs.provenance import versions
from headprobe.results import collect

T = TypeVar("T")


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


def read_record(path: Path, job: str) -> dict[str, Any]:
    """The run record at ``path`` when it is ``job``'s (``{}`` when missing, unreadable or another's)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("job") == job else {}


def merged_settings(earlier: dict[str, Any], now: dict[str, Any], adds: Sequence[str]) -> dict[str, Any]:
    """The settings of a folder that two runs wrote: ``now``'s, with each field of ``adds`` holding
    ``earlier``'s items and then ``now``'s new ones (a rerun that asked for fewer lengths keeps the others;
    a single value, e.g. shortctx's ``task``, becomes the list of the values the runs gave)."""
    merged = dict(now)
    for name in adds:
        if name not in earlier:
            continue
        old, new = earlier[name], now.get(name)
        if not isinstance(new, list):
            old, new = (old if isinstance(old, list) else [old]), [new]
        items: dict[str, Any] = {}
        for item in [*(old or []), *new]:
            items.setdefault(json.dumps(item, sort_keys=True), item)
        merged[name] = list(items.values()) if len(items) > 1 or isinstance(now.get(name), list) else new[0]
    return merged


def write_run_record(
    out: Path, job: str, settings: dict[str, Any], report: RunReport[Any], adds: Sequence[str] = ()
) -> None:
    """``OUT/run.json``: what the folder holds, however many runs wrote it. ``settings``: this run's, merged
    with the earlier runs' (:func:`merged_settings`: each list of ``adds`` keeps what earlier runs added; a
    setting other runs gave other values, e.g. each checkpoint's ``samples``, holds every value given, and
    ``varies`` names it: look up each run's under ``runs``);
    ``checkpoints``: every checkpoint any run measured there, by name; ``errors``: the failures among them
    (a checkpoint's last: one that succeeded since has none); ``command`` and ``versions``: the last run's;
    ``runs``: every run's own command, settings, versions, checkpoints and failures, oldest first."""
    path = out / RUN_FILE
    earlier = read_record(path, job)
    now = resume_key(**settings)
    run = {
        "command": list(sys.argv),
        "settings": now,
        "versions": versions(),
        "checkpoints": report.checkpoints,
        "errors": report.errors,
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    errors = {k: v for k, v in earlier.get("errors", {}).items() if k not in report.results} | report.errors
    runs = [*earlier.get("runs", []), run]
    merged = merged_settings(earlier.get("settings", {}), now, adds)
    varies = []
    for name in (n for n in now if n not in adds):  # a setting the runs gave other values: every value, said so
        values: dict[str, Any] = {}
        for r in runs:
            if name in r.get("settings", {}):
                values.setdefault(json.dumps(r["settings"][name], sort_keys=True), r["settings"][name])
        if len(values) > 1:
            merged[name], varies = list(values.values()), [*varies, name]
    record = {
        "job": job,
        "command": run["command"],
        "settings": merged,
        "varies": varies,
        "versions": run["versions"],
        "checkpoints": {**earlier.get("checkpoints", {}), **report.checkpoints},
        "errors": errors,
        "runs": runs,
    }
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
