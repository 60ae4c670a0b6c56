"""One sample's forward passes, shared by every metric that reads them: :class:`Probe` and :func:`run_probes`.

A metric describes its work on one sample as a :class:`Probe`: the inputs it needs a forward pass over (token ids),
a hook for each that sees every attention call, and how its result comes out once they have run. Probes of one
sample run together: each distinct input once, with the hooks of every probe that needs it, which share what they
compute alike through the pass's :data:`Shared` values (:func:`shared`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headprobe.hooked.base import HookedModel
from headprobe.model.seam import AttentionCall

Shared = dict[Hashable, Any]  # what the hooks of one forward pass compute alike (:func:`shared`)
PassHook = Callable[[AttentionCall, Shared], None]  # (an attention call, this pass's shared values)


@dataclass(frozen=True)
class Probe:
    """One metric's work on one sample: ``runs``, the forward passes it needs (token ids and the hook that sees each
    of their attention calls), and ``score``, its result once they have run (what it does after them, a greedy
    decode say, it does there)."""

    runs: tuple[tuple[tuple[int, ...], PassHook], ...]
    score: Callable[[], Any]


def shared(memo: Shared, key: Hashable, make: Callable[[], Any]) -> Any:
    """``memo[key]``, made by ``make()`` the first time a hook of this pass asks for it."""
    if key not in memo:
        memo[key] = make()
    return memo[key]


def run_probes(model: HookedModel, probes: Sequence[Probe]) -> list[Any]:
    """Every probe's result, each distinct input run once with the hooks of every probe that needs it (in the order
    first asked), sharing what they compute alike."""
    passes: dict[tuple[int, ...], list[PassHook]] = {}
    for probe in probes:
        for ids, hook in probe.runs:
            passes.setdefault(ids, []).append(hook)
    with torch.no_grad():
        for ids, hooks in passes.items():
            memo: Shared = {}
            every = lambda call, hooks=hooks, memo=memo: [h(call, memo) for h in hooks]  # noqa: E731
            model.run(torch.tensor([list(ids)]), hook=every)
    return [probe.score() for probe in probes]


def score_sample(model: HookedModel, probe: Probe) -> Any:
    """One probe run alone: its result."""
    return run_probes(model, [probe])[0]
