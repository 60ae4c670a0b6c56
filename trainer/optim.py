"""Optimizer and learning-rate schedules. The schedule is a pure function of the step, so resuming
needs only the step number."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from trainer.config import ScheduleKind, TrainError


@dataclass(frozen=True)
class Schedule:
    """Learning rate at each optimizer step.

    Attributes:
        kind: ``cosine`` (linear warmup, cosine decay to ``min_lr_ratio * lr``) or ``wsd``
            (warmup, stable at ``lr``, then linear decay to ``min_lr_ratio * lr`` over the last
            ``decay_fraction`` of the steps).
        lr: peak learning rate.
        total_steps: steps of the whole stage.
        warmup_steps: linear warmup from ``lr / warmup_steps`` to ``lr``.
        min_lr_ratio: final learning rate as a fraction of ``lr``.
        decay_fraction: ``wsd`` only.
    """

    kind: ScheduleKind
    lr: float
    total_steps: int
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ScheduleKind(self.kind))  # raises naming the choices
        if self.total_steps < 1 or self.warmup_steps < 0 or self.lr <= 0:
            raise ValueError("schedule needs total_steps >= 1, warmup_steps >= 0 and lr > 0")

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        floor = self.lr * self.min_lr_ratio
        if self.kind is ScheduleKind.COSINE:
            span = max(1, self.total_steps - self.warmup_steps)
            progress = min(1.0, (step - self.warmup_steps) / span)
            return floor + (self.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        decay_steps = max(1, round(self.total_steps * self.decay_fraction))
        decay_start = self.total_steps - decay_steps
        if step < decay_start:
            return self.lr
        return self.lr + (floor - self.lr) * min(1.0, (step - decay_start + 1) / decay_steps)


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW over the trainable parameters; matrices decay, vectors (norm weights) do not."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise TrainError("no trainable parameters: everything is frozen")
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=betas)
