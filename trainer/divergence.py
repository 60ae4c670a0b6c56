"""Whether a training run ended collapsed: the rules behind ``status`` in ``result.json`` (``"trained"`` or
``"diverged"``, with ``status_reason``).

The rules read the logged steps (``metrics.jsonl``'s rows: ``step``, ``loss``, ``accuracy``, and ``level``
for a curriculum) and judge the state the run ended in; a collapse that a run recovered from is not one.
Means are over :data:`WINDOW` logged steps (the *moving mean* at a row: its value and the ``WINDOW - 1``
rows before it).

1. **non-finite loss**: some logged loss is not a finite number (the trainer refuses to finish such a run
   anyway: no ``final/``).
2. **accuracy back to chance**: the moving mean of the training accuracy is at most ``chance +
   CHANCE_MARGIN`` at each of the last ``WINDOW`` rows (so for ``2 * WINDOW - 1`` logged steps: a curriculum's
   level advance can drop it as low for a few steps, from which a healthy run recovers), and at some earlier
   row it was at least ``chance + LEARNED`` (the run had clearly learned something). ``chance``
   (:func:`chance_accuracy`) is ``1 / vocab_size``, or for a run from scratch the mean accuracy of its first
   ``WINDOW`` logged steps after warm-up when that is higher: what it scores once it has learned which tokens
   are frequent, before it has learned to use its context.
3. **loss back above its early value**: among the rows after warm-up (``step > warmup``) of the run's last
   curriculum level (every row without a curriculum: a level's loss legitimately jumps when a curriculum
   advances, so only rows of one level are compared), at least ``2 * WINDOW``, the moving mean of the loss
   at the last row exceeds ``1 + LOSS_MARGIN`` times the mean of the first ``WINDOW`` of them.
4. **started from a diverged run**: the run starts from the ``final/`` weights of a run whose ``result.json``
   says it diverged (:func:`inherited_status`).

The toy grid's ``toy-k64v16`` collapses so (seed 0, measured 2026-12-07): its training accuracy reaches 0.8
on the first level (rows of 32 tokens); the step the rows grow to 64 tokens (685) its loss jumps from 0.9 to
10 and its accuracy to 0.05, and it stays there: a 20-step mean of 0.02-0.11 to step 800 (loss 5.4), against
a chance of 0.115 (steps 51-70); rule 2 fires from step 701. ``toy-d64`` takes the same jump at the same
advance (step 473: loss 8.0, accuracy 0.08) and recovers within 20 steps (a 20-step mean of at least 0.23,
against a chance of 0.09), so it is not flagged. Each rule that fires adds its reason, naming the step from
which its condition held to the end.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRAINED, DIVERGED = "trained", "diverged"
WINDOW = 20  # logged steps in a moving mean
CHANCE_MARGIN = 0.05  # accuracy within this of chance is "at chance"
LEARNED = 0.25  # accuracy this far above chance is "clearly above it"
LOSS_MARGIN = 0.2  # a loss above (1 + LOSS_MARGIN) x its early value is "back above it"

Row = Mapping[str, Any]


@dataclass(frozen=True)
class RunStatus:
    """``status`` (``"trained"`` or ``"diverged"``) and, when diverged, ``reason``: each rule that fired."""

    status: str = TRAINED
    reason: str | None = None


def moving_means(values: Sequence[float], window: int = WINDOW) -> list[float]:
    """The mean of each ``window`` consecutive values, ending at ``values[window - 1]``, ..., ``values[-1]``."""
    return [sum(values[i - window + 1 : i + 1]) / window for i in range(window - 1, len(values))]


def chance_accuracy(rows: Sequence[Row], vocab_size: int, warmup: int, from_scratch: bool) -> float:
    """Chance training accuracy: ``1 / vocab_size``, or for a run ``from_scratch`` the mean accuracy of its
    first :data:`WINDOW` logged steps after ``warmup`` when that is higher."""
    first = [float(r["accuracy"]) for r in rows if r["step"] > warmup][:WINDOW]
    early = sum(first) / len(first) if from_scratch and first else 0.0
    return max(1.0 / vocab_size, early)


def _since(rows: Sequence[Row], holds: Sequence[bool]) -> int:
    """The step from which ``holds`` (one flag per moving mean, the last for the last row) is true to the end."""
    first = len(holds) - 1
    while first > 0 and holds[first - 1]:
        first -= 1
    return int(rows[len(rows) - len(holds) + first]["step"])


def _non_finite(rows: Sequence[Row], _warmup: int, _chance: float) -> str | None:
    bad = next((r for r in rows if not math.isfinite(float(r["loss"]))), None)
    return None if bad is None else f"non-finite loss: the training loss was {bad['loss']} at step {bad['step']}"


def _accuracy_at_chance(rows: Sequence[Row], _warmup: int, chance: float) -> str | None:
    means = moving_means([float(r["accuracy"]) for r in rows])
    at_chance = [m <= chance + CHANCE_MARGIN for m in means]
    if len(means) < WINDOW or not all(at_chance[-WINDOW:]) or max(means) < chance + LEARNED:
        return None
    best = max(range(len(means)), key=means.__getitem__)
    return (
        f"training accuracy back to chance: its mean over {WINDOW} logged steps within {CHANCE_MARGIN} of chance "
        f"({chance:.3f}) from step {_since(rows, at_chance)} to the end ({means[-1]:.3f} at the last), after "
        f"{means[best]:.3f} at step {rows[best + WINDOW - 1]['step']}"
    )


def _loss_rebound(rows: Sequence[Row], warmup: int, _chance: float) -> str | None:
    level = rows[-1].get("level") if rows else None
    mine = [r for r in rows if r["step"] > warmup and r.get("level") == level]
    if len(mine) < 2 * WINDOW:
        return None
    means = moving_means([float(r["loss"]) for r in mine])
    early, bound = means[0], means[0] * (1 + LOSS_MARGIN)
    if means[-1] <= bound:
        return None
    since = _since(mine, [m > bound for m in means])
    where = "after warm-up" + ("" if level is None else f" of curriculum level {level}")
    return (
        f"training loss back above its early value: its mean over the last {WINDOW} logged steps is {means[-1]:.3f}, "
        f"above {1 + LOSS_MARGIN:g} x {early:.3f} (the mean of the first {WINDOW} logged steps {where}), since step "
        f"{since}"
    )


RULES: tuple[Callable[[Sequence[Row], int, float], str | None], ...] = (_non_finite, _accuracy_at_chance, _loss_rebound)


def run_status(rows: Sequence[Row], warmup: int, chance: float) -> RunStatus:
    """The status of a run whose logged steps are ``rows`` (in step order), ``warmup`` its warm-up steps and
    ``chance`` its chance accuracy (:func:`chance_accuracy`); see the module docstring for the rules."""
    reasons = [reason for rule in RULES if (reason := rule(rows, warmup, chance))]
    return RunStatus(DIVERGED, "; ".join(reasons)) if reasons else RunStatus()


def inherited_status(source: Path | None, own: RunStatus) -> RunStatus:
    """``own``, or ``"diverged"`` when ``source`` (the ``result.json`` of the run whose ``final/`` weights this run
    starts from) says that run diverged: a run continued from collapsed weights is no member's result either."""
    if source is None or not source.is_file():
        return own
    try:
        record = json.loads(source.read_text())
    except (OSError, ValueError):
        return own
    if record.get("status") != DIVERGED:
        return own
    reason = f"it starts from the weights of {source.parent}, which diverged ({record.get('status_reason')})"
    return RunStatus(DIVERGED, "; ".join(r for r in (own.reason, reason) if r))
