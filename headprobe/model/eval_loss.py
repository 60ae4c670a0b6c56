"""A model's loss on fixed rows, pooled over all their targets and per split: the held-out evaluation loss
(the rows: :func:`headprobe.text.heldout.eval_rows`; the trainer logs it during training, ``headprobe study``
measures every finished run with it).

A row is anything with ``ids`` (token ids), ``targets`` (per id, whether it is predicted and counted) and
``split`` (the name its targets count under). Rows are scored in batches of rows of similar length,
right-padded (causal attention: padding after a position never changes it), without gradients and in eval
mode; the model is left in the mode it was in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from headprobe.model.transformer import Transformer

EVAL_LOSS = "eval_loss"


class Row(Protocol):
    ids: Sequence[int]
    targets: Sequence[bool]
    split: str


def split_losses(model: Transformer, rows: Sequence[Row], batch: int = 16) -> dict[str, float]:
    """``eval_loss`` (every target of ``rows``) and ``eval_loss_<split>`` for each split the rows name: the
    mean next-token cross-entropy in nats per target token; ``nan`` where there is no target.

    Rows are scored split by split, ``batch`` rows of similar length per forward pass (each cut after its
    last target), through the model's own loss (only target positions reach the LM head)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for split in dict.fromkeys(r.split for r in rows):
                mine = sorted((r for r in rows if r.split == split and any(r.targets[1:])), key=_end)
                parts = (_summed_loss(model, mine[i : i + batch], device) for i in range(0, len(mine), batch))
                sums[split] = sum(parts)
                counts[split] = sum(sum(r.targets[1:]) for r in mine)
    finally:
        model.train(was_training)
    total = sum(counts.values())
    out = {EVAL_LOSS: sum(sums.values()) / total if total else float("nan")}
    for split in sums:
        out[f"{EVAL_LOSS}_{split}"] = sums[split] / counts[split] if counts[split] else float("nan")
    return out


def _end(row: Row) -> int:
    """How many of ``row``'s ids matter: up to its last target (id 0 is never one: nothing comes before it)."""
    return max((i + 1 for i, t in enumerate(row.targets) if t and i), default=1)


def _summed_loss(model: Transformer, rows: Sequence[Row], device: torch.device) -> float:
    """The summed cross-entropy (nats, float32 sums) of ``rows``' targets: the rows cut after their last target
    and right-padded into ``ids``, ``mask``: ``[rows, width]``; inputs ``ids[:, :-1]`` predict ``ids[:, 1:]``
    where ``mask[:, 1:]``."""
    ends = [_end(r) for r in rows]
    ids = torch.zeros((len(rows), max(ends)), dtype=torch.long)
    mask = torch.zeros((len(rows), max(ends)), dtype=torch.bool)
    for i, (r, end) in enumerate(zip(rows, ends, strict=True)):
        ids[i, :end] = torch.tensor(list(r.ids[:end]))
        mask[i, :end] = torch.tensor(list(r.targets[:end]))
    ids, mask = ids.to(device), mask.to(device)
    return float(model(ids[:, :-1], targets=ids[:, 1:], loss_mask=mask[:, 1:]))
