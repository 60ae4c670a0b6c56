"""What ``headprobe study`` measures on the trained grid: :class:`StudySettings` (the recipe's ``study``
section, changed by its profile's)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from headprobe.analysis.settings import MIN_LENGTH
from headprobe.core.errors import HeadprobeError
from headprobe.core.settings import check_ranges, setting
from headprobe.text.probes import Probe, TaskProbeError


class StudyError(HeadprobeError, ValueError):
    """Bad study settings; the message names the setting (in backticks)."""


@dataclass
class StudySettings:
    """The measurements of every finished run of the grid.

    Attributes:
        probes: held-out task probes (``task@distance``, distance in characters), on every run: exact
            greedy answers to facts whose keys never occurred in training (:mod:`headprobe.text.probes`).
        probe_samples: examples per probe.
        analysis_runs: the runs ``headprobe analyze`` measures (retrieval heads, entropy, reordering,
            effective rank): before cpt, after cpt, after frozen-attention cpt.
        analysis_metrics / analysis_lengths / analysis_samples / analysis_rows / analysis_needle_reach: its
            settings (:class:`headprobe.analysis.AnalyzeSettings`); retrieval uses the ``codes`` needles.
        ruler_runs / ruler_tasks / ruler_lengths / ruler_samples: RULER-style evaluation
            (:class:`headprobe.evals.ruler.RulerSettings`) of these runs.
        shortctx_runs: the runs scored on the short-context tasks.
        shortctx_tasks: ``task -> file``: the short-context tasks (``builtin``, needing no file, or a loader of
            :data:`headprobe.evals.shortctx.items.LOADERS` with the task's local file in its original format).
    """

    probes: list[str] = field(default_factory=lambda: ["needle@100", "needle@500", "needle@1000", "needle@1500"])
    probe_samples: int = setting(32, minimum=1)
    analysis_runs: list[str] = field(default_factory=lambda: ["pt", "cpt", "cpt-frozen"])
    analysis_metrics: list[str] = field(default_factory=lambda: ["retrieval", "entropy", "reordering", "erank"])
    analysis_lengths: list[int] = setting(factory=lambda: [1024], minimum=MIN_LENGTH)
    analysis_samples: int = setting(4, minimum=1)
    analysis_rows: str = "all"
    analysis_needle_reach: int = setting(0, minimum=0)
    ruler_runs: list[str] = field(default_factory=lambda: ["cpt", "cpt-frozen", "sft"])
    ruler_tasks: list[str] = field(default_factory=lambda: ["niah_single_1", "niah_single_2", "niah_multikey_1"])
    ruler_lengths: list[int] = setting(factory=lambda: [512, 1024], minimum=1)
    ruler_samples: int = setting(8, minimum=1)
    shortctx_runs: list[str] = field(default_factory=lambda: ["pt", "sft"])
    shortctx_tasks: dict[str, str | None] = field(default_factory=lambda: {"builtin": None})

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> StudySettings:
        raw = dict(raw or {})
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise StudyError(f"unknown study settings {unknown}")
        settings = cls(**raw)
        settings.validate()
        return settings

    def validate(self) -> None:
        check_ranges(self, StudyError)
        for spec in self.probes:
            try:
                Probe.parse(spec)
            except TaskProbeError as err:  # said as the study setting it is
                raise StudyError(f"`probes`: {err}") from None
        from headprobe.evals.shortctx.items import LOADERS

        for task, file in self.shortctx_tasks.items():
            if task != "builtin" and task not in LOADERS:
                raise StudyError(f"`shortctx_tasks`: unknown task {task!r}; known: builtin, {', '.join(LOADERS)}")
            if task != "builtin" and not file:
                raise StudyError(f"`shortctx_tasks`: {task} needs its local file (task=FILE)")

    def probe_list(self) -> list[Probe]:
        return [Probe(p.task, p.distance, self.probe_samples) for p in map(Probe.parse, self.probes)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
