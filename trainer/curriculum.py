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
  :class:`~headprobe.text.tasks.TaskSettings`; ``tasks``: that level's own task weights; ``row``:
  tokens per row, shorter than ``seq_len``: each ``seq_len`` row of the step is cut into rows of
  ``row`` tokens packed apart, so a step holds as many tokens but a head sees fewer unrelated keys,
  which is what lets a copy circuit form early (docs/training.md); ``accuracy``: that level's own
  advance threshold, for tasks whose attainable accuracy is lower; ``probe``: that level's own advance
  probe, see below). A level repeats the previous one's fields it does not name except ``accuracy``
  and ``probe`` (``"row": null`` returns to full rows); the ``grow``
  levels use full rows. And/or ``grow``: distance levels ``[lo/2, lo], [lo/2*f, lo*f], ...`` up to
  ``hi`` after the listed ones, the segment growing with the distance up to its own cap
  (``segment_max``, default 96), with the file's ``tasks``.
* ``advance``: ``{"accuracy": a, "window": n}`` moves to the next level once the mean training accuracy
  on the target tokens over the last ``n`` steps exceeds ``a`` (an adaptive curriculum, driven by what
  the model has learned); ``{"steps": k}`` moves every ``k`` steps (a schedule);
  ``{"probe": "copy@300", "accuracy": a, "every": k}`` runs that held-out probe (:mod:`headprobe.text.probes`:
  unseen keys, exactly that distance, greedy exact answers) every ``k`` steps and moves on once its score
  exceeds ``a``: an adaptive curriculum driven by retrieval the training rows cannot shortcut, e.g. gating
  each level on a distance past every sliding window (a level's own ``probe`` overrides the file's).
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

from headprobe.core.paths import read_utf8
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer, encode_spans
from headprobe.text.probes import Probe, TaskProbeError
from headprobe.text.tasks import TaskMix, TaskSettings
from trainer.config import TrainError
from trainer.data import Batch, PackedSequences, collate

_SETTINGS = ("distance", "segment", "pairs", "queries", "split")
FIT_TRIES = 64  # consecutive examples too long for a row's start before a level is refused as set up wrong


@dataclass(frozen=True)
class Curriculum:
    """A parsed curriculum file (see the module docstring)."""

    tasks: dict[str, float]
    levels: tuple[TaskSettings, ...]
    level_tasks: tuple[dict[str, float], ...] = ()  # each level's task weights (default: ``tasks``)
    level_rows: tuple[int | None, ...] = ()  # each level's tokens per row (None: ``seq_len``)
    level_accuracy: tuple[float | None, ...] = ()  # each level's advance threshold (None: ``accuracy``)
    level_probe: tuple[str | None, ...] = ()  # each level's advance probe (None: ``probe``)
    accuracy: float | None = 0.85
    window: int = 20
    steps: int | None = None
    probe: str | None = None  # advance on this held-out probe's score (``task@distance``), not training accuracy
    probe_check_every: int = 0  # steps between advance probes
    prose: float = 0.0
    probes: tuple[str, ...] = ()
    probe_every: int = 0
    source: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def load(cls, path: str | Path) -> Curriculum:
        path = Path(path)
        text = read_utf8(path, "curriculum file", TrainError)
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise TrainError(f"{path} is not valid JSON: {err}") from None
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "curriculum") -> Curriculum:
        unknown = sorted(set(raw) - {"tasks", "levels", "grow", "advance", "prose", "probes", "probe_every"})
        if unknown:
            raise TrainError(f"{where}: unknown fields {unknown}")
        try:
            levels, level_tasks, level_rows, level_accuracy, level_probe = _levels(raw)
            for tasks, settings in zip(level_tasks, levels, strict=True):
                TaskMix(tasks, settings)  # validates the task names and weights
        except (ValueError, TypeError, KeyError) as err:
            raise TrainError(f"{where}: {err}") from None
        advance = raw.get("advance", {"accuracy": 0.85, "window": 20})
        rules = '{"accuracy": a, "window": n}, {"steps": k} or {"probe": "task@distance", "accuracy": a, "every": k}'
        probing = "probe" in advance
        allowed = {"probe", "accuracy", "every"} if probing else {"accuracy", "window", "steps"}
        if (
            not isinstance(advance, dict)
            or set(advance) - allowed
            or (not probing and ("steps" in advance) == ("accuracy" in advance))
            or (probing and not {"accuracy", "every"} <= set(advance))
        ):
            raise TrainError(f"{where}: advance is {rules}")
        if any(level_probe) and not probing:
            raise TrainError(f"{where}: a level's `probe` needs an advance rule with a probe ({rules})")
        for spec in {advance.get("probe"), *level_probe} - {None}:
            try:
                Probe.parse(spec)
            except TaskProbeError as err:
                raise TrainError(f"{where}: advance {err}") from None
        every = int(advance.get("every", 0))
        if probing and every < 1:
            raise TrainError(f"{where}: advance `every` is the steps between advance probes, >= 1 (got {every})")
        prose = float(raw.get("prose", 0.0))
        if not 0 <= prose < 1:
            raise TrainError(f"{where}: prose is the share of prose rows, in [0, 1)")
        return cls(
            tasks={str(k): float(v) for k, v in (raw.get("tasks") or {}).items()},
            levels=tuple(levels),
            level_tasks=tuple(level_tasks),
            level_rows=tuple(level_rows),
            level_accuracy=tuple(level_accuracy),
            level_probe=tuple(level_probe),
            accuracy=advance.get("accuracy"),
            window=int(advance.get("window", 20)),
            steps=advance.get("steps"),
            probe=advance.get("probe"),
            probe_check_every=every,
            prose=prose,
            probes=tuple(raw.get("probes", ())),
            probe_every=int(raw.get("probe_every", 0)),
            source=raw,
        )

    def mix(self, level: int) -> TaskMix:
        i = min(level, len(self.levels) - 1)
        return TaskMix(self.level_tasks[i] if self.level_tasks else self.tasks, self.levels[i])

    def row_tokens(self, level: int, seq_len: int) -> int:
        """Tokens per row at ``level`` (at most ``seq_len``)."""
        rows = self.level_rows[min(level, len(self.levels) - 1)] if self.level_rows else None
        return min(rows or seq_len, seq_len)

    def advance_probe(self, level: int) -> Probe | None:
        """The held-out probe whose score moves a run past ``level`` (None: training accuracy or a schedule)."""
        if self.probe is None:
            return None
        own = self.level_probe[min(level, len(self.levels) - 1)] if self.level_probe else None
        return Probe.parse(own or self.probe)

    def threshold(self, level: int) -> float:
        """The score ``level`` must exceed to advance (its own ``accuracy``, else the file's)."""
        own = self.level_accuracy[min(level, len(self.levels) - 1)] if self.level_accuracy else None
        return own if own is not None else (self.accuracy or 0.0)

    def identity(self) -> str:
        """A digest of the file's content (part of the run's data identity)."""
        return hashlib.sha256(json.dumps(self.source, sort_keys=True).encode()).hexdigest()[:16]


def _levels(
    raw: dict[str, Any],
) -> tuple[list[TaskSettings], list[dict[str, float]], list[int | None], list[float | None], list[str | None]]:
    """Each level's settings, task weights, row length, advance threshold and advance probe: the listed
    ``levels``, then the ``grow`` ones. A level's ``accuracy`` and ``probe`` are its own, not inherited."""
    if "levels" not in raw and "grow" not in raw:
        raise TrainError("give `levels` (a list), `grow` (a distance range and factor) or both")
    tasks = {str(k): float(v) for k, v in (raw.get("tasks") or {}).items()}
    out, weights, rows, thresholds, probes, current = [], [], [], [], [], {}
    own = ("accuracy", "probe")  # a level's own, not inherited
    for level in raw.get("levels", []):
        extra = set(level) - set(_SETTINGS) - {"tasks", "row", *own}
        if extra:
            fields = ", ".join(("tasks", "row", *own, *_SETTINGS))
            raise TrainError(f"unknown level fields {sorted(extra)}; a level sets {fields}")
        accuracy = level.get("accuracy")
        if accuracy is not None and not 0 < accuracy < 1:
            raise TrainError(f"a level's `accuracy` is an advance threshold in (0, 1) (got {accuracy!r})")
        thresholds.append(accuracy)
        probes.append(level.get("probe"))
        current = {**current, **{k: v for k, v in level.items() if k not in own}}
        settings = {k: tuple(v) if isinstance(v, list) else v for k, v in current.items() if k not in ("tasks", "row")}
        out.append(TaskSettings(**settings))
        weights.append({str(k): float(v) for k, v in current.get("tasks", tasks).items()})
        row = current.get("row")
        if row is not None and (not isinstance(row, int) or row < 8):
            raise TrainError(f"a level's `row` is tokens per row, an integer >= 8 (got {row!r})")
        rows.append(row)
    if "levels" in raw and not out:
        raise TrainError("`levels` is empty")
    if "grow" in raw:
        lo, hi = raw["grow"]["distance"]
        factor, cap = float(raw["grow"].get("factor", 1.25)), int(raw["grow"].get("segment_max", 96))
        if factor <= 1 or not 1 <= lo <= hi:
            raise TrainError("grow needs 1 <= distance[0] <= distance[1] and a factor > 1")
        d = float(lo)
        while True:
            top = int(min(d, hi))
            out.append(TaskSettings(distance=(top // 2, top), segment=(8, max(16, min(cap, top)))))
            weights.append(tasks)
            rows.append(None)
            thresholds.append(None)
            probes.append(None)
            if top >= hi:
                break
            d *= factor
    return out, weights, rows, thresholds, probes


@dataclass
class CurriculumState:
    """Where a run is in its curriculum: the level, the step it began, the recent training accuracies."""

    level: int = 0
    since: int = 0
    recent: list[float] = field(default_factory=list)

    def observe(self, step: int, accuracy: float, c: Curriculum) -> bool:
        """Fold in the training accuracy of ``step`` (0-based); advance a level when the rule says so (a
        probe-driven curriculum advances in :meth:`observe_probe` only)."""
        if self.level >= len(c.levels) - 1 or c.probe is not None:
            return False
        if c.steps is not None:
            advance = step + 1 - self.since >= c.steps
        else:
            self.recent = [*self.recent, accuracy][-c.window :]
            advance = len(self.recent) == c.window and sum(self.recent) / c.window > c.threshold(self.level)
        return self._advance(advance, step)

    def observe_probe(self, step: int, score: float, c: Curriculum) -> bool:
        """Fold in the advance probe's score after ``step`` (0-based): advance when it exceeds the level's
        threshold."""
        if self.level >= len(c.levels) - 1 or c.probe is None:
            return False
        self.recent = [score]
        return self._advance(score > c.threshold(self.level), step)

    def _advance(self, advance: bool, step: int) -> bool:
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
        """Row ``row`` of ``step`` at full length: tokens and target mask (``seq_len + 1`` each). At a
        level with shorter rows, the pieces of :meth:`rows` joined."""
        pieces = self.rows(step, row)
        return np.concatenate([t for t, _ in pieces]), np.concatenate([m for _, m in pieces])

    def rows(self, step: int, row: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The training rows that make up row ``row`` of ``step``: one of ``seq_len + 1`` tokens, or, at a
        level with ``row`` tokens per row, ``(seq_len + 1) // (row + 1)`` rows of ``row + 1`` packed apart."""
        rng = np.random.default_rng([self.seed, step, row])
        width = self.c.row_tokens(self.state.level, self.seq_len)
        count = 1 if width >= self.seq_len else (self.seq_len + 1) // (width + 1)
        if self.prose is not None and rng.random() < self.c.prose:
            text = self.prose.item(int(rng.integers(len(self.prose))))[0]
            w = len(text) if count == 1 else width + 1
            return [(text[i * w : (i + 1) * w], np.ones(w, dtype=bool)) for i in range(count)]
        base = (step * 1_000_003 + row) * 4096  # a distinct range of example indices per row
        out, used = [], 0
        for _ in range(count):
            tokens, mask, n = self._packed(width, base + used)
            out.append((tokens, mask))
            used += n
        return out

    def _packed(self, width: int, first: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``width + 1`` tokens (and their target mask) of examples ``first, first + 1, ...`` of the current
        level, each after an end-of-text token; also how many examples were drawn. A row's first example must
        fit whole (later ones may be cut): one that does not is passed over for the next, and a level none of
        whose :data:`FIT_TRIES` consecutive examples fits is refused, naming the fix."""
        mix, eos = self.c.mix(self.state.level), self.tokenizer.eos_id
        ids: list[int] = [eos]
        mask: list[bool] = [False]
        k = 0
        while len(ids) < width + 1:
            ex = mix.example(self.seed, first + k)
            tokens, flags = encode_spans(self.tokenizer, ex.text, ex.loss_spans or [(0, len(ex.text))])
            k += 1
            if len(ids) == 1 and len(tokens) + 1 > width:  # a rare long draw (long nouns) gives way to the next
                if k < FIT_TRIES:
                    continue
                what = "`seq_len`" if width == self.seq_len else "the level's `row`"
                raise TrainError(
                    f"curriculum level {self.state.level} ({mix.settings.distance[1]} characters apart) makes "
                    f"{FIT_TRIES} {ex.kind} examples in a row that do not fit (the last {len(tokens):,} tokens), "
                    f"longer than {what} {width:,}; raise {what} or lower the level's distance"
                )
            ids += [*tokens, eos]
            mask += [*flags, False]
        return np.asarray(ids[: width + 1]), np.asarray(mask[: width + 1]), k

    def micro_batches(self, step: int, rank: int, world: int, batch_size: int, micro: int) -> list[Batch]:
        per = batch_size // world
        rows = [self.rows(step, r) for r in range(rank * per, (rank + 1) * per)]
        # a micro-batch holds the pieces of `micro` full rows, so tokens per micro-batch stay the same
        return [collate([p for r in rows[i : i + micro] for p in r], self.pad_id) for i in range(0, per, micro)]
