"""``logit_contrib``: LOCOS's logit contribution with spatial contrast ("Logit-Contribution Scoring Identifies
Non-Literal Retrieval Heads", arXiv 2607.01002; their code's ``locos/detectors/logit_contrib.py``), at the
teacher-forced answer steps (docs/metrics.md).

At answer step ``t`` (query row ``r_t``, producing token ``y_t``), head ``h`` of key/value head ``g`` puts ``a_t(j)`` on
each key ``j`` it sees (``V_t``, ``K_t = |V_t|`` keys). With ``u = W_U[y_t]`` (the unembedding row, no final norm, as
LOCOS), ``w = W_O[h]^T u`` (``W_O[h]`` the head's columns of the output projection) and ``v_j`` the value of key ``j``::

    phi_j = a_t(j) * (v_j . w)                      the logit of y_t that key j sends through the head
    L+ = sum_{j in N and V_t} phi_j                  the needle's keys N (the whole needle sentence and the reach)
    L- = sum_{j in V_t, not N} phi_j * n_t / (K_t - n_t)    n_t = |N and V_t|: the rest, scaled to the needle's size
    logit_contrib(h) = mean_t (L+ - L-)              (logits)

A row that sees no needle key (a sliding window past it) adds 0. Only the answer rows' attention is built, one
row per step over its keys. LOCOS decodes greedily and keeps trials whose generation holds the gold answer and
passes ROUGE-1 recall 0.5; here the answer is forced, so every model has a number, and a trial whose greedy answer
starts with the gold one scores the same rows.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.metrics.definitions import Options, Scored, head_grid, refused, rows_hook
from headprobe.metrics.probe import Probe
from headprobe.metrics.probs import key_positions, row_positions
from headprobe.metrics.retrieval import Span, forced_prompt
from headprobe.model.masks import CausalMask
from headprobe.model.seam import AttentionCall
from headprobe.text.needles import NeedlePrompt


def contrast(probs: Tensor, v: Tensor, w: Tensor, on_needle: Tensor, visible: Tensor) -> Tensor:
    """``L+ - L-`` per head and row (module docstring), ``[heads, rows]``.

    Args:
        probs: ``[heads, rows, keys]`` attention probabilities.
        v: ``[heads, keys, v_dim]`` each query head's values.
        w: ``[heads, rows, v_dim]`` ``W_O[h]^T u`` of each head and row.
        on_needle: ``[keys]`` the needle's keys.
        visible: ``[rows, keys]`` the keys each row sees.
    """
    phi = probs * torch.einsum("hkv,hrv->hrk", v, w)
    needle = on_needle[None, :] & visible  # [rows, keys]
    rest = ~on_needle[None, :] & visible
    n, others = needle.sum(-1).double(), rest.sum(-1).double()
    plus = torch.where(needle[None], phi, torch.zeros_like(phi)).sum(-1)
    minus = torch.where(rest[None], phi, torch.zeros_like(phi)).sum(-1) * torch.where(
        others > 0, n / others.clamp(min=1), 0.0
    )
    return plus - minus


NO_SENTENCE = "the prompt does not record the needle sentence's tokens (build it with needle_prompt)"


def logit_contrib(model: HookedModel, prompt: NeedlePrompt, options: Options) -> Probe:
    """One sample's ``logit_contrib`` of every head (module docstring): one forward pass with the answer forced."""
    if prompt.sentence[0] < 0:
        return refused(NO_SENTENCE)
    forced = forced_prompt(model, prompt, Span(options.span), options.needle_reach)
    first, last = prompt.sentence[0], min(prompt.sentence[1] + options.needle_reach, prompt.length)
    u = model.unembedding()[torch.tensor(forced.targets, device=model.device)].double()  # [rows, d_model]
    value = head_grid(model)

    def seen(call: AttentionCall, found: np.ndarray, probs: Tensor) -> None:
        heads, v_dim = call.q.shape[1], call.v.shape[-1]
        w_o = model.output_projection(call.layer).double().view(-1, heads, v_dim)  # [d_model, heads, v_dim]
        w = torch.einsum("dhv,rd->hrv", w_o, u[torch.as_tensor(found)].to(w_o.device))
        v = call.v[0].double().repeat_interleave(heads // call.v.shape[1], dim=0)
        keys = key_positions(call)
        at = torch.as_tensor(forced.rows, device=keys.device)[torch.as_tensor(found)] - call.query_start
        visible = CausalMask(call.window).visible(row_positions(call, at)[:, None], keys[None, :])
        on = (keys >= first) & (keys < last)
        value[call.layer, :heads] = contrast(probs, v, w, on, visible).mean(-1).cpu().numpy()

    return Probe(((tuple(forced.ids), rows_hook(forced.rows, seen)),), lambda: Scored({"value": value}))
