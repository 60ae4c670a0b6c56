"""What figures read: a results folder's tidy tables, each row labelled with its member, seed and run.

A results folder is what ``headprobe study`` (or the ``analyses/`` scripts) writes: the study's tables
under ``tables/`` (``study_runs`` names every run's ``model`` with its ``member``, ``seed``, ``run``),
and per-model tables below it (``analysis/<model>/entropy.parquet``, ``ruler/<model>/...``); or what
``headprobe analyze`` / ``headprobe ruler eval`` / ``headprobe ablate`` write for any model, with no study
around it: ``OUT/<model>/<table>.parquet``, read by :meth:`Results.models`. Figures read only through
:class:`Results`, which reads only through :mod:`headprobe.results`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import not_a
from headprobe.results import ResultsError, ResultsWarning, TableMeta, collect, read_meta
from headprobe.study.tables import diverged_runs, without_runs

WHO = ["member", "seed", "run"]
MODEL_TABLES = (  # the per-model figures' tables
    "retrieval",
    "entropy",
    "erank",
    "needle_margin",
    "ruler_scores",
    "ruler_samples",
    "ablation",
    "graft",
)


class MissingInput(HeadprobeError, LookupError):
    """A figure's input table is absent (or holds none of the rows it needs); the figure is skipped."""


@dataclass
class Results:
    """A results folder's tables, read once each."""

    folder: Path
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    read_apart: list[str] = field(default_factory=list, repr=False)  # the ResultsWarnings of what was read

    def __post_init__(self) -> None:
        self.folder = Path(self.folder)
        if why := not_a(self.folder, "folder"):
            raise ResultsError(
                f"results folder {self.folder} {why} "
                "(give the folder that `headprobe study`, `analyze` or `ruler eval` wrote)"
            )

    def raw(self, table: str) -> pd.DataFrame:
        """Every ``<table>.parquet`` below the folder, concatenated, each row with its ``model``
        (:func:`headprobe.results.collect`: results of different checkpoints or settings that share a name
        are labelled apart); empty when there is none."""
        if table not in self._cache:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ResultsWarning)
                self._cache[table] = collect(self.folder, table, recursive=True)
            for w in caught:  # kept for the report's caveats, and warned as collect warned
                if issubclass(w.category, ResultsWarning) and str(w.message) not in self.read_apart:
                    self.read_apart.append(str(w.message))
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return self._cache[table]

    def runs(self) -> pd.DataFrame:
        """``model`` -> ``member``, ``seed``, ``run`` (and the run's training record), from ``study_runs``."""
        return self.raw("study_runs")

    def diverged(self) -> pd.DataFrame:
        """The runs ``study_runs`` marks diverged (``member``, ``seed``, ``run``; none without a status)."""
        return diverged_runs(self.runs())

    def table(self, table: str, keep_diverged: bool = False) -> pd.DataFrame:
        """``table`` with ``member``, ``seed`` and ``run`` columns (joined on ``model`` from ``study_runs``
        where the table lacks them), the rows of diverged runs left out (:meth:`diverged`: a diverged run is
        never an architecture's number) unless ``keep_diverged``. Raises :class:`MissingInput` when the table is
        absent or empty."""
        frame = self._labelled(table)
        if keep_diverged or table == "study_runs":
            return frame
        kept = without_runs(frame, self.diverged())
        if kept.empty:
            raise MissingInput(f"every {table!r} row belongs to a diverged run")
        return kept

    def _labelled(self, table: str) -> pd.DataFrame:
        frame = self.raw(table)
        if frame.empty:
            raise MissingInput(f"no {table!r} table under {self.folder}")
        if all(c in frame.columns for c in WHO):
            return frame
        runs = self.runs()
        if runs.empty:
            raise MissingInput(
                f"{table!r} rows name only models; no 'study_runs' table says which member each is "
                "(the per-model figures draw them)"
            )
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

    def models(self, table: str, keys: list[str] | None = None, steps: bool = False) -> pd.DataFrame:
        """:meth:`raw` rows of models that are not runs of a study in this folder (``study_runs`` names
        those; the study's figures draw them), one row per ``model`` x ``keys`` (the last one read where
        folders repeat the results of one checkpoint made alike). Rows measured on a run's step checkpoints
        (a ``step`` column: ``analyze RUN --steps``) are the ``retrieval_steps`` figure's: kept only with
        ``steps``. Raises :class:`MissingInput` when none is left, saying why."""
        frame = self.raw(table)
        if frame.empty:
            raise MissingInput(f"no {table!r} table under {self.folder}")
        if not steps and "step" in frame.columns:
            frame = frame[frame["step"].isna()]
            if frame.empty:
                raise MissingInput(f"every {table!r} table here is of a step checkpoint, which the "
                                   "'retrieval_steps' figure draws")  # fmt: skip
        runs = self.runs()
        if "model" in runs.columns:
            frame = frame[~frame["model"].isin(set(runs["model"]))]
            if frame.empty:
                raise MissingInput(
                    f"every {table!r} table here belongs to a run of the study ('study_runs'), which the study's "
                    "figures draw; give one model's folder (e.g. analysis/<model>) to draw it alone"
                )
        if keys:
            frame = frame.drop_duplicates(["model", *keys], keep="last")
        return frame.reset_index(drop=True)

    def sources(self, tables: list[str]) -> list[tuple[Path, TableMeta]]:
        """Each ``<table>.parquet`` of ``tables`` below the folder (relative path) with what produced it."""
        out = []
        for table in tables:
            for path in sorted(p for p in self.folder.rglob(f"{table}.parquet") if p.is_file()):
                meta = read_meta(path)
                if meta is not None:
                    out.append((path.relative_to(self.folder), meta))
        return out

    def absent(self, family: str) -> str | None:
        """Why the folder holds no results of a spec family (``None`` when it holds some): ``study``, any
        ``study_*`` table; ``model``, a :data:`MODEL_TABLES` table with rows of a model that is not a run
        of the folder's study."""
        if family == "study":
            if any(p.is_file() for p in self.folder.rglob("study_*.parquet")):
                return None
            return "not a study's results folder (no study_* table: `headprobe study` writes them)"
        for table in MODEL_TABLES:
            try:
                self.models(table, steps=True)
                return None
            except MissingInput:
                continue
        return f"no model's own results ({', '.join(MODEL_TABLES)}) beside the study's runs"
