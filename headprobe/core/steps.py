"""A training run's step checkpoints as folders: ``RUN/step_XXXXXX/`` (written by :mod:`trainer.train_state`),
found, read and chosen without loading a weight.

A step folder holds ``state.json`` (:data:`STEP_FILE`: the step, the tokens seen, the
model's config and tokenizer, the training settings) and ``dcp/`` (the weights and optimizer state in
torch.distributed.checkpoint format). A run keeps every one of them when trained with ``--save-every K
--keep all``; :func:`select_steps` picks those ``headprobe analyze RUN --steps ...`` measures."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headprobe.core.errors import HeadprobeError

STEP_RE = re.compile(r"^step_(\d{6,})$")
STEP_FILE = "state.json"  # a step folder's state, beside its shards (written by trainer.train_state)
WEIGHTS_DIR = "dcp"  # the step folder's weights (and optimizer state), as torch.distributed.checkpoint wrote them
STEPS_HELP = "all | every:K (the steps that are multiples of K) | a comma list of steps (100,200,800)"


class StepError(HeadprobeError, ValueError):
    """A run without step checkpoints, or a step choice naming steps it does not hold."""


def step_folder(run: Path, step: int) -> Path:
    """Where step ``step`` of the run folder ``run`` is kept: ``RUN/step_000100``."""
    return run / f"step_{step:06d}"


def list_steps(run: Path) -> list[tuple[int, Path]]:
    """The complete step folders of the run folder ``run`` as ``(step, folder)``, oldest first (a folder being
    written is ``.step_XXXXXX.tmp``, not listed)."""
    if not run.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run.iterdir() if p.is_dir() and (m := STEP_RE.match(p.name))]
    return sorted(found)


def is_step_folder(path: str | Path) -> bool:
    """Whether ``path`` is a step folder: its ``state.json`` beside its ``dcp/`` weights."""
    path = Path(path)
    return (path / STEP_FILE).is_file() and (path / WEIGHTS_DIR).is_dir()


def read_step(folder: str | Path) -> dict[str, Any]:
    """The ``state.json`` of the step folder ``folder``: ``step``, ``tokens``, ``model_config``, ``tokenizer``
    and the training settings. Raises :class:`StepError` when it cannot be read."""
    path = Path(folder) / STEP_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise StepError(f"{path} cannot be read ({err}); the step folder is damaged: give another step") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise StepError(f"{path} records no step; the step folder is damaged: give another step")
    return state


@dataclass(frozen=True)
class StepInfo:
    """Where in its training a step checkpoint lies: ``step`` (optimizer steps) and ``tokens`` (training tokens
    seen), the ``step`` and ``tokens`` columns of the tables measured from it."""

    step: int
    tokens: int | None

    @classmethod
    def of(cls, folder: str | Path) -> StepInfo | None:
        """The step of ``folder``; ``None`` for a path that is no step folder."""
        if not is_step_folder(folder):
            return None
        state = read_step(folder)
        tokens = state.get("tokens")
        return cls(state["step"], tokens if isinstance(tokens, int) else None)


def _shown(steps: list[int]) -> str:
    """Steps as a message lists them: every one up to 8, else the first 3, a count and the last 2."""
    if len(steps) <= 8:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:3]))}, ... ({len(steps) - 5} more) ..., {steps[-2]}, {steps[-1]}"


def parse_steps(spec: str) -> str | int | list[int]:
    """The step choice ``spec`` (:data:`STEPS_HELP`): ``"all"``, the ``K`` of ``every:K``, or the listed steps.
    Raises :class:`StepError` naming what is wrong and what to write."""
    text = spec.strip().lower()
    if text == "all":
        return "all"
    if text.startswith("every:"):
        k = text.removeprefix("every:").strip()
        if not k.isdigit() or int(k) < 1:
            raise StepError(f"--steps {spec!r}: every:K takes a whole number of steps K of at least 1, e.g. every:100")
        return int(k)
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if not x.isdigit()]
    if not items or bad:
        what = f"{bad[0]!r} is not a step" if bad else "no step is named"
        raise StepError(f"--steps {spec!r}: {what}; write {STEPS_HELP}")
    return sorted({int(x) for x in items})


def select_steps(run: str | Path, spec: str) -> list[Path]:
    """The step folders of the run folder ``run`` that ``spec`` (:data:`STEPS_HELP`) chooses, oldest first.

    Raises :class:`StepError`, before anything is loaded: ``run`` is a step folder itself or holds no step
    folders (train with ``--save-every K --keep all``), ``every:K`` matches none of its steps, or listed steps
    are not among those it holds (each message lists what it holds)."""
    run = Path(run)
    choice = parse_steps(spec)
    if is_step_folder(run):
        raise StepError(
            f"{run} is one step checkpoint, not a run folder; give its run folder {run.parent} with --steps"
        )
    held = list_steps(run)
    if not held:
        raise StepError(
            f"{run} holds no step checkpoints (step_XXXXXX folders); train it with `headprobe train --save-every K "
            "--keep all` to keep one every K steps, or give its checkpoints without --steps"
        )
    steps = [s for s, _ in held]
    if choice == "all":
        return [p for _, p in held]
    if isinstance(choice, int):
        chosen = [p for s, p in held if s % choice == 0]
        if not chosen:
            raise StepError(f"--steps every:{choice}: none of {run}'s steps is a multiple of {choice}; it holds steps "
                            f"{_shown(steps)}")  # fmt: skip
        return chosen
    missing = [s for s in choice if s not in steps]
    if missing:
        raise StepError(f"--steps: {run} holds no step {_shown(missing)}; it holds steps {_shown(steps)}")
    return [p for s, p in held if s in choice]
