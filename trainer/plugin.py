"""The trainer as a plugin of the ``headprobe`` command line.

headprobe never imports the trainer: its command line finds this object through the entry point
``headprobe.plugins: trainer`` (pyproject.toml) and uses only what it offers here. Importing it is
cheap (no torch); the training code loads when a command runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from headprobe.core.errors import HeadprobeError
from headprobe.core.steps import STEP_FILE
from headprobe.text.tasks import TaskMix
from trainer.config import ReportCount, TrainConfig, TrainResult
from trainer.data import check_new_folder


class TrainerPlugin:
    """What ``headprobe train ...`` and ``headprobe data ...`` run.

    Attributes:
        config: the dataclass whose fields are ``headprobe train``'s options (help in field metadata).
    """

    config = TrainConfig

    errors: tuple[type[Exception], ...] = (HeadprobeError, FileNotFoundError)
    """The exceptions that mean bad input (shown as a message, exit code 2), not a bug: every error of
    headprobe's own (the trainer's, an unknown preset, not a checkpoint, an unusable attention backend ...:
    one base, importable without torch), and a missing file."""

    def train(self, cfg: TrainConfig, on_step: ReportCount | None = None) -> TrainResult:
        from trainer.train import train

        return train(cfg, on_step)

    def grid(
        self,
        recipe: str,
        out: str,
        members: list[str] | None = None,
        runs: list[str] | None = None,
        seeds: list[int] | None = None,
        profile: str | None = None,
        overrides: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
        on_step: ReportCount | None = None,
        jobs: int = 1,
    ) -> dict[str, Any]:
        """Train a recipe's grid (:func:`trainer.grid.run_grid`); returns the manifest. ``on_step(step,
        total, info)`` follows each run's steps (a progress bar), with ``jobs`` > 1 all chains' steps as one
        count (the processes also log)."""
        from trainer.grid import run_grid
        from trainer.train import train

        def stage(cfg: TrainConfig) -> TrainResult:
            return train(cfg, on_step)

        return run_grid(
            recipe, out, members, runs, seeds, profile, overrides, run_stage=stage, log=log, jobs=jobs, on_step=on_step
        )

    def last_step(self, out: str | Path) -> Path | None:
        """The newest complete step checkpoint in the run folder ``out`` (what ``--resume`` continues from), or
        ``None`` (torch is imported only when ``out`` holds a step folder)."""
        if not any(Path(out).glob("step_*")):
            return None
        from headprobe.core.steps import list_steps

        steps = list_steps(Path(out))
        return steps[-1][1] if steps else None

    def recipe(self, recipe: str, profile: str | None = None) -> dict[str, Any]:
        """A recipe with its profile applied: ``scale``, ``seeds``, ``runs`` (settings by run), ``source``
        (its file) and ``study`` (what ``headprobe study`` measures)."""
        import dataclasses

        from trainer.grid import Recipe

        return dataclasses.asdict(Recipe.load(recipe, profile))

    def export(self, step_folder: Path, out: Path, overwrite: bool = False) -> Path:
        """The step folder ``step_folder`` as a plain checkpoint ``out`` (:func:`trainer.train_state.export_step`:
        an existing checkpoint there is replaced only with ``overwrite``; nothing else ever is)."""
        from trainer.train_state import export_step

        if not (step_folder / STEP_FILE).is_file():
            raise FileNotFoundError(f"{step_folder} is not a step checkpoint (no state.json)")
        return export_step(step_folder, out, overwrite)

    def prepare(
        self,
        sources: Sequence[Path],
        tokenizer: str,
        out: Path,
        dtype: str,
        progress: ReportCount | None,
        overwrite: bool = False,
    ):
        """Tokenise ``sources`` into the new data folder ``out``; an existing ``out`` is refused unless
        ``overwrite`` (:func:`trainer.data.check_new_folder`), then replaced atomically."""
        from headprobe.text.toy_tokenizer import open_tokenizer
        from trainer.data import prepare

        check_new_folder(out, overwrite, sources)
        return prepare(sources, open_tokenizer(tokenizer), out, dtype=dtype, progress=progress)

    def synth(
        self,
        tokens: int,
        out: Path,
        tokenizer: str,
        seed: int,
        progress: ReportCount | None,
        tasks: TaskMix | None = None,
        overwrite: bool = False,
    ):
        """Generate ``tokens`` tokens into the new data folder ``out`` (refused or replaced as in
        :meth:`prepare`)."""
        from headprobe.text.toy_tokenizer import open_tokenizer
        from trainer.data import synth

        check_new_folder(out, overwrite)
        return synth(tokens, out, open_tokenizer(tokenizer), seed=seed, progress=progress, tasks=tasks)

    def verify(self, folder: Path) -> tuple[int, int]:
        """Check every shard against its SHA-256; returns ``(tokens, shards)``."""
        from trainer.data import TokenData

        data = TokenData(folder, verify=True)
        return len(data), len(data.manifest.shards)


PLUGIN = TrainerPlugin()
