"""The run's metrics: ``metrics.jsonl`` (one JSON line per logged step) plus optional TensorBoard / W&B."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from headprobe.core.atomic import atomic_write_text
from trainer.config import TrainConfig


class MetricsLog:
    """``metrics.jsonl`` plus optional TensorBoard / W&B, main process only. ``rows``: the ``step``, ``loss``,
    ``accuracy``, ``level`` and held-out losses of every row logged (on a resumed run, first the file's rows
    up to the step resumed from, on the main process): the run's status is judged from them
    (:mod:`trainer.divergence`)."""

    def __init__(self, out: Path, resume_step: int, cfg: TrainConfig, enabled: bool) -> None:
        self.enabled = enabled
        self.path = out / "metrics.jsonl"
        self.tb = self.wandb = None
        self.last_loss: float | None = None  # of the last step logged before this process began
        self.rows: list[dict[str, Any]] = []
        if not enabled:
            return
        if self.path.exists():  # drop lines past the checkpoint we resume from
            keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            atomic_write_text(self.path, "".join(ln + "\n" for ln in keep))
            self.rows = [_kept(json.loads(ln)) for ln in keep]
            self.last_loss = json.loads(keep[-1]).get("loss") if keep else None
        self.file = self.path.open("a")
        if cfg.tensorboard:
            with contextlib.suppress(ImportError):
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
        if cfg.wandb:
            with contextlib.suppress(ImportError):
                import wandb

                self.wandb = wandb.init(project="headprobe", dir=str(out), config=cfg.to_dict())

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(_kept(row))
        if not self.enabled:
            return
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        for key, value in row.items():
            if self.tb is not None and isinstance(value, (int, float)) and key != "step":
                self.tb.add_scalar(key, value, row["step"])
        if self.wandb is not None:
            self.wandb.log(row, step=row["step"])

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            if self.tb is not None:
                self.tb.close()
            if self.wandb is not None:
                self.wandb.finish()


def _kept(row: dict[str, Any]) -> dict[str, Any]:
    """What the run's end reads of a logged row: the divergence rules' fields and the held-out losses."""
    return {k: v for k, v in row.items() if k in ("step", "loss", "accuracy", "level") or k.startswith("eval_loss")}
