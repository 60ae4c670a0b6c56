"""``needle_mass``: HeadKV's retrieval-reasoning score (Fu et al., arXiv 2410.19258; their code's
``retrieval_head_detection_r2.py``), at the teacher-forced answer steps (docs/metrics.md).

With ``N`` the needle's keys (the answer span and the needle reach after it, as the forced mass counts them) and
``K = |N|``, at each answer step ``t`` (query row ``r_t``) a head puts ``a_t(j)`` on key ``j``; its ``K`` largest
probabilities ``TopK(a_t)`` (ties to the earlier key) count where they fall on the needle::

    needle_mass(h) = sum_t sum_{j in TopK(a_t) and j in N} a_t(j) / |N|

HeadKV decodes greedily for as many tokens as the answer has and keeps samples whose answer F1 passes 0.5; here
the answer is forced, so every model has a number and a sample whose greedy answer is the gold one gets the
same rows. Their code's first version multiplied by ``10 / |A|`` (``|A|`` answer tokens); the current one does
not, nor does this.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.metrics.definitions import NO_SPAN, Options, Scored, head_grid, refused, rows_hook
from headprobe.metrics.probe import Probe
from headprobe.metrics.probs import key_positions
from headprobe.metrics.retrieval import Span, answer_span, forced_prompt
from headprobe.model.seam import AttentionCall
from headprobe.text.needles import NeedlePrompt


def top_mass(probs: Tensor, on_needle: Tensor, k: int) -> Tensor:
    """``[heads, rows]``: the mass of each row's ``k`` largest probabilities (``probs [heads, rows, keys]``; ties
    to the earlier key) that falls on the keys where ``on_needle [keys]`` holds."""
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :k]
    top = torch.gather(probs, -1, order)
    return torch.where(on_needle[order], top, torch.zeros_like(top)).sum(-1)


def needle_mass(model: HookedModel, prompt: NeedlePrompt, options: Options) -> Probe:
    """One sample's ``needle_mass`` of every head (module docstring): one forward pass with the answer forced."""
    if answer_span(model, prompt, options.span)[0] < 0:
        return refused(NO_SPAN)
    forced = forced_prompt(model, prompt, Span(options.span), options.needle_reach)
    first, last = forced.read
    value = head_grid(model)

    def seen(call: AttentionCall, found: np.ndarray, probs: Tensor) -> None:
        keys = key_positions(call).cpu()
        on = (keys >= first) & (keys < last)
        heads = probs.shape[0]
        value[call.layer, :heads] = (top_mass(probs, on, last - first).sum(-1) / (last - first)).numpy()

    return Probe(((tuple(forced.ids), rows_hook(forced.rows, seen)),), lambda: Scored({"value": value}))
