"""What figures read: a results folder's tidy tables, each row labelled with its member, seed and run.

A results folder is what ``headprobe study`` (or the ``analyses/`` scripts) writes: the study's tables
under ``tables/`` (``study_runs`` names every run's ``model`` with its ``member``, ``seed``, ``run``),
and per-model tables below it (``analysis/<model>/entropy.parquet``, ``ruler/<model>/...``). Figures
read only through :class:`Results`, which reads only through :mod:`headprobe.results`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headprobe.results import ResultsError, collect

WHO = ["member", "seed", "run"]


class MissingInput(LookupError):
    """A figure's input table is absent (or holds none of the rows it needs); the figure is skipped."""


@dataclass
class Results:
    """A results folder's tables, read once each."""

    folder: Path
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if not self.folder.is_dir():
            raise ResultsError(f"results folder {self.folder} does not exist (give the folder a study wrote)")

    def raw(self, table: str) -> pd.DataFrame:
        """Every ``<table>.parquet`` below the folder, concatenated (empty when there is none)."""
        if table not in self._cache:
            self._cache[table] = collect(self.folder, table, recursive=True)
        return self._cache[table]

    def runs(self) -> pd.DataFrame:
        """``model`` -> ``member``, ``seed``, ``run`` (and the run's training record), from ``study_runs``."""
        return self.raw("study_runs")

    def table(self, table: str) -> pd.DataFrame:
        """``table`` with ``member``, ``seed`` and ``run`` columns (joined on ``model`` from ``study_runs``
        where the table lacks them). Raises :class:`MissingInput` when the table is absent or empty."""
        frame = self.raw(table)
        if frame.empty:
            raise MissingInput(f"no {table!r} table under {self.folder}")
        if all(c in frame.columns for c in WHO):
            return frame
        runs = self.runs()
        if runs.empty:
            raise MissingInput(f"{table!r} rows name only models; no 'study_runs' table says which member each is")
        labels = runs[["model", *WHO]].drop_duplicates("model")
        joined = frame.drop(columns=[c for c in WHO if c in frame.columns]).merge(labels, on="model", how="inner")
        if joined.empty:
            raise MissingInput(f"no {table!r} row belongs to a run of 'study_runs'")
        return joined

    def members(self) -> list[str]:
        """Every member any table names (the colour map is built from this, so colours agree)."""
        names: set[str] = set()
        for table in ("study_runs", "study_probes", "study_ruler", "study_heads"):
            frame = self.raw(table)
            if "member" in frame.columns:
                names |= set(frame["member"].dropna())
        return sorted(names)
