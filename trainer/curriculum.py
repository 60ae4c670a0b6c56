"""Curricula: synthetic retrieval tasks generated on the fly, their difficulty growing level by level.

A curriculum file (JSON) names the tasks (:mod:`headprobe.text.tasks`), the levels, when to advance,
and the probes to log::

    {
      "tasks": {"copy": 2, "recall": 1, "needle": 1},
      "levels": [{"distance": [8, 16], "segment": [8, 16]}, {"distance": [16, 32]}],
      "grow": {"distance": [16, 2048], "factor": 1.25},
      "advance": {"accuracy": 0.85, "window": 20},
      "prose": 0.25,
      "probes": ["needle@200", "needle@1000"],
      "probe_every": 100
    }

* ``levels``: the task settings of each level, easy to hard (fields of
  :class:`~headprobe.text.tasks.TaskSettings`, and ``tasks``: that level's own task weights; a level
  repeats the previous one's fields it does not name). And/or ``grow``: distance levels
  ``[lo/2, lo], [lo/2*f, lo*f], ...`` up to ``hi`` after the listed ones, the segment growing with the
  distance up to its own cap (``segment_max``, default 96), with the file's ``tasks``.
* ``advance``: ``{"accuracy": a, "window": n}`` moves to the next level once the mean training accuracy
  on the target tokens over the last ``n`` steps exceeds ``a`` (an adaptive curriculum, driven by what
  the model has learned); ``{"steps": k}`` moves every ``k`` steps (a schedule).
* ``prose``: the share of rows taken from the run's ``data`` folder (plain text, every token a target).
* ``probes``: held-out evaluations (``task@distance``) logged every ``probe_every`` steps
  (:mod:`trainer.probes`).

Rows are packed from examples drawn deterministically from ``(seed, step, row)`` at the current level,
and the curriculum's state (level, when it began, the recent accuracies) is saved in every step
checkpoint, so a resumed run reads exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, encode_spans
from headprobe.text.tasks import TaskMix, TaskSettings
from trainer.config import TrainError
from trainer.data import Batch, PackedSequences, collate

_SETTINGS = ("distance", "segment", "pairs", "queries", "split")


@dataclass(frozen=True)
class Curriculum:
    """A parsed curriculum file (see the module docstring)."""

    tasks: dict[str, float]
    levels: tuple[TaskSettings, ...]
    level_tasks: tuple[dict[str, float], ...] = ()  # each level's task weights (default: ``tasks``)
    accuracy: float | None = 0.85
    window: int = 20
    steps: int | None = None
    prose: float = 0.0
    probes: tuple[str, ...] = ()
    probe_every: int = 0
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> Curriculum:
        path = Path(path)
        if not path.is_file():
            raise TrainError(f"curriculum file {path} does not exist")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise TrainError(f"{path} is not valid JSON: {err}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "curriculum") -> Curriculum:
        unknown = sorted(set(raw) - {"tasks", "levels", "grow", "advance", "prose", "probes", "probe_every"})
        if unknown:
            raise TrainError(f"{where}: unknown fields {unknown}")
        try:
            levels, level_tasks = _levels(raw)
            for tasks, settings in zip(level_tasks, levels, strict=True):
                TaskMix(tasks, settings)  # validates the task names and weights
        except (ValueError, TypeError, KeyError) as err:
            raise TrainError(f"{where}: {err}") from None
        advance = raw.get("advance", {"accuracy": 0.85, "window": 20})
        if set(advance) - {"accuracy", "window", "steps"} or ("steps" in advance) == ("accuracy" in advance):
            raise TrainError(f'{where}: advance is {{"accuracy": a, "window": n}} or {{"steps": k}}')
        prose = float(raw.get("prose", 0.0))
        if not 0 <= prose < 1:
            raise TrainError(f"{where}: prose is the share of prose rows, in [0, 1)")
        return cls(
            tasks={str(k): float(v) for k, v in (raw.get("tasks") or {}).items()},
            levels=tuple(levels),
            level_tasks=tuple(level_tasks),
            accuracy=advance.get("accuracy"),
            window=int(advance.get("window", 20)),
            steps=advance.get("steps"),
            prose=prose,
            probes=tuple(raw.get("probes", ())),
            probe_every=int(raw.get("probe_every", 0)),
            source=raw,
        )

    def mix(self, level: int) -> TaskMix:
        i = min(level, len(self.levels) - 1)
        return TaskMix(self.level_tasks[i] if self.level_tasks else self.tasks, self.levels[i])

    def identity(self) -> str:
        """A digest of the file's content (part of the run's data identity)."""
        return hashlib.sha256(json.dumps(self.source, sort_keys=True).encode()).hexdigest()[:16]


def _levels(raw: dict[str, Any]) -> tuple[list[TaskSettings], list[dict[str, float]]]:
    """Each level's settings and task weights: the listed ``levels``, then the ``grow`` ones."""
    if "levels" not in raw and "grow" not in raw:
        raise ValueError("give `levels` (a list), `grow` (a distance range and factor) or both")
    tasks = {str(k): float(v) for k, v in (raw.get("tasks") or {}).items()}
    out, weights, current = [], [], {}
    for level in raw.get("levels", []):
        extra = set(level) - set(_SETTINGS) - {"tasks"}
        if extra:
            raise ValueError(f"unknown level fields {sorted(extra)}; a level sets tasks, {', '.join(_SETTINGS)}")
        current = {**current, **level}
        settings = {k: tuple(v) if isinstance(v, list) else v for k, v in current.items() if k != "tasks"}
        out.append(TaskSettings(**settings))
        weights.append({str(k): float(v) for k, v in current.get("tasks", tasks).items()})
    if "levels" in raw and not out:
        raise ValueError("`levels` is empty")
    if "grow" in raw:
        lo, hi = raw["grow"]["distance"]
        factor, cap = float(raw["grow"].get("factor", 1.25)), int(raw["grow"].get("segment_max", 96))
        if factor <= 1 or not 1 <= lo <= hi:
            raise ValueError("grow needs 1 <= distance[0] <= distance[1] and a factor > 1")
        d = float(lo)
        while True:
            top = int(min(d, hi))
            out.append(TaskSettings(distance=(top // 2, top), segment=(8, max(16, min(cap, top)))))
            weights.append(tasks)
            if top >= hi:
                break
            d *= factor
    return out, weights


@dataclass
class CurriculumState:
    """Where a run is in its curriculum: the level, the step it began, the recent training accuracies."""

    level: int = 0
    since: int = 0
    recent: list[float] = field(default_factory=list)

    def observe(self, step: int, accuracy: float, c: Curriculum) -> bool:
        """Fold in the accuracy of ``step`` (0-based); advance a level when the rule says so."""
        last = len(c.levels) - 1
        if self.level >= last:
            return False
        if c.steps is not None:
            advance = step + 1 - self.since >= c.steps
        else:
            self.recent = [*self.recent, accuracy][-c.window :]
            advance = len(self.recent) == c.window and sum(self.recent) / c.window > (c.accuracy or 0.0)
        if advance:
            self.level, self.since, self.recent = self.level + 1, step + 1, []
        return advance

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "since": self.since, "recent": list(self.recent)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CurriculumState:
        return cls(int(raw["level"]), int(raw["since"]), [float(x) for x in raw["recent"]])


class CurriculumSource:
    """The rows of each step: examples of the current level packed into ``seq_len + 1`` tokens, and a
    ``prose`` share of rows from packed plain text."""

    def __init__(
        self,
        curriculum: Curriculum,
        tokenizer: ByteTokenizer | HFTokenizer,
        seq_len: int,
        seed: int,
        prose: PackedSequences | None = None,
    ) -> None:
        if curriculum.prose and prose is None:
            raise TrainError("the curriculum mixes in prose rows: give `data` (a data folder of plain text)")
        self.c, self.tokenizer, self.seq_len, self.seed, self.prose = curriculum, tokenizer, seq_len, seed, prose
        self.state = CurriculumState()
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id

    def describe(self) -> dict[str, Any]:
        return {"kind": "curriculum", "curriculum": self.c.identity(), "prose": bool(self.prose)}

    def row(self, step: int, row: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``row`` of ``step``: tokens and target mask (``seq_len + 1`` each)."""
        rng = np.random.default_rng([self.seed, step, row])
        if self.prose is not None and rng.random() < self.c.prose:
            return self.prose.item(int(rng.integers(len(self.prose))))[0], np.ones(self.seq_len + 1, dtype=bool)
        mix, eos = self.c.mix(self.state.level), self.tokenizer.eos_id
        ids: list[int] = [eos]
        mask: list[bool] = [False]
        base = (step * 1_000_003 + row) * 4096  # a distinct range of example indices per row
        k = 0
        while len(ids) < self.seq_len + 1:
            ex = mix.example(self.seed, base + k)
            tokens, flags = encode_spans(self.tokenizer, ex.text, ex.loss_spans or [(0, len(ex.text))])
            if k == 0 and len(tokens) + 1 > self.seq_len:  # later examples may be cut; the first must fit
                raise TrainError(
                    f"curriculum level {self.state.level} ({mix.settings.distance[1]} characters apart) makes "
                    f"a {ex.kind} example of {len(tokens):,} tokens, longer than `seq_len` {self.seq_len:,}; "
                    "raise `seq_len` or lower the level's distance"
                )
            ids += [*tokens, eos]
            mask += [*flags, False]
            k += 1
        return np.asarray(ids[: self.seq_len + 1]), np.asarray(mask[: self.seq_len + 1])

    def micro_batches(self, step: int, rank: int, world: int, batch_size: int, micro: int) -> list[Batch]:
        per = batch_size // world
        rows = [self.row(step, r) for r in range(rank * per, (rank + 1) * per)]
        return [collate(rows[i : i + micro], self.pad_id) for i in range(0, per, micro)]
