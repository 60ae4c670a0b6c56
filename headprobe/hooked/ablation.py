"""Head ablation: what a set of attention heads writes, removed at the seam.

A head's output is its attention-weighted values ``z: [batch, q_len, v_dim]`` before the layer's output
projection (``o_proj``). Ablating it replaces ``z`` there, in every forward pass while the context is
open, for our models and Hugging Face models alike (:meth:`headprobe.model.seam.Seam.intervene`):

* ``zero``: ``z = 0``: the head writes nothing;
* ``mean``: ``z`` = the head's mean output over the positions the sequence has had so far, this call's
  included: over an unchunked prompt that is its mean over the prompt's positions, the same vector at
  every position; each decoded token then adds its own position to the mean. A call whose queries
  start at position 0 begins a new sequence. Mean ablation needs one sequence at a time (a left-padded
  batch is refused).

Heads are ``(layer, head)`` pairs, written ``17.3`` (layer 17, query head 3; both from 0).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.model.config import LayerInfo
from headprobe.model.seam import AttentionCall, Seam


class AblationMode(Choice, what="ablation mode"):
    """What an ablated head writes instead of its output."""

    ZERO = "zero"
    MEAN = "mean"


class AblationError(HeadprobeError, ValueError):
    """Heads that the model does not have, or an ablation that cannot run as asked; the message says which."""


@dataclass(frozen=True, order=True)
class Head:
    """One attention head: ``layer`` (block index) and ``head`` (query head index), both from 0."""

    layer: int
    head: int

    def __str__(self) -> str:
        return f"{self.layer}.{self.head}"

    @classmethod
    def parse(cls, text: str) -> Head:
        """``"17.3"`` -> ``Head(17, 3)``."""
        layer, dot, head = text.strip().partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise AblationError(f"head {text!r} is not LAYER.HEAD (e.g. 17.3: layer 17, head 3, both from 0)")
        return cls(int(layer), int(head))


def parse_heads(text: str) -> list[Head]:
    """``"17.3,18.7"`` -> the heads, in order, without repeats."""
    heads = [Head.parse(part) for part in text.split(",") if part.strip()]
    if not heads:
        raise AblationError("no heads given; write them as LAYER.HEAD,LAYER.HEAD (e.g. 17.3,18.7)")
    return list(dict.fromkeys(heads))


def format_heads(heads: Sequence[Head]) -> str:
    """``[Head(17, 3), Head(18, 7)]`` -> ``"17.3,18.7"`` (the form tables store)."""
    return ",".join(str(h) for h in heads)


def check_heads(heads: Sequence[Head], layers: Sequence[LayerInfo], model: str = "the model") -> None:
    """Raise :class:`AblationError` naming every head ``model`` does not have (and what it has)."""
    bad = [h for h in heads if not 0 <= h.layer < len(layers) or not 0 <= h.head < layers[h.layer].n_heads]
    if bad:
        counts = sorted({info.n_heads for info in layers})
        per = " or ".join(str(c) for c in counts)
        raise AblationError(
            f"{model} has no head {format_heads(bad)}: it has layers 0-{len(layers) - 1} with {per} heads each "
            f"(heads 0-{max(counts) - 1}); give heads as LAYER.HEAD, both from 0"
        )


class HeadAblation:
    """The intervention that ablates ``heads`` (see the module docstring); a callable for
    :meth:`~headprobe.model.seam.Seam.intervene`."""

    def __init__(self, heads: Sequence[Head], mode: AblationMode | str = AblationMode.ZERO) -> None:
        self.mode = AblationMode(mode)
        self.heads = sorted(set(heads))
        self.by_layer: dict[int, list[int]] = {}
        for h in self.heads:
            self.by_layer.setdefault(h.layer, []).append(h.head)
        self._sums: dict[int, tuple[Tensor, int]] = {}  # layer -> (sum over positions [batch, k, v_dim], count)

    def __call__(self, call: AttentionCall, out: Tensor) -> Tensor:
        """``out: [batch, heads, q_len, v_dim]`` with the layer's ablated heads replaced."""
        chosen = self.by_layer.get(call.layer)
        if not chosen:
            return out
        index = torch.tensor(chosen, device=out.device)
        out = out.clone()
        if self.mode is AblationMode.ZERO:
            out[:, index] = 0
            return out
        if call.padding is not None:
            raise AblationError("mean ablation follows one sequence at a time; decode the prompts one by one")
        picked = out[:, index].to(torch.float64)  # [batch, k, q_len, v_dim]
        total, count = self._sums.get(call.layer, (None, 0)) if call.query_start > 0 else (None, 0)
        total = picked.sum(2) if total is None else total + picked.sum(2)
        count += out.shape[2]
        self._sums[call.layer] = (total, count)
        out[:, index] = (total / count)[:, :, None, :].to(out.dtype)
        return out


@contextlib.contextmanager
def ablated(seam: Seam, layers: Sequence[LayerInfo], heads: Sequence[Head], mode: AblationMode | str,
            model: str = "the model") -> Iterator[HeadAblation]:  # fmt: skip
    """Ablate ``heads`` in every forward pass through ``seam`` while the context is open (always removed);
    heads the model does not have are refused before anything runs."""
    check_heads(heads, layers, model)
    ablation = HeadAblation(heads, mode)
    with seam.intervene(ablation):
        yield ablation
