"""Exact attention probabilities of chosen query rows, never an ``L x L`` matrix: the primitive the head-score
definitions (:mod:`headprobe.metrics.definitions`) read from each attention call.

* :func:`row_probs` every key's probability at a few rows (answer steps, question rows): ``[heads, rows, k_len]``,
  linear in the length;
* :func:`key_probs` the probabilities of a few chosen keys at many rows (echo and induction keys at three
  quarters of a long input), from each row's log-sum-exp (:func:`headprobe.stats.attention_stats`), in blocks of
  rows: ``[heads, rows, n_keys]``.

Both compute in float64 from the call's post-RoPE queries and keys; query head ``h`` reads key head
``h // (heads // kv_heads)``; a key a row cannot see (after it, or outside its window) has probability 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headprobe.model.masks import CausalMask
from headprobe.model.seam import AttentionCall
from headprobe.stats import attention_stats

ROW_BLOCK = 512  # rows per block in key_probs (the gathered keys: heads x ROW_BLOCK x n_keys x qk_dim)


def _kv(call: AttentionCall, x: Tensor) -> Tensor:
    """``x [kv_heads, ...]`` repeated to one entry per query head."""
    return x.repeat_interleave(call.q.shape[1] // x.shape[0], dim=0)


def row_positions(call: AttentionCall, at: Tensor) -> Tensor:
    """Absolute positions ``[rows]`` of the call's query indices ``at``."""
    return call.query_start + at.to(torch.long)


def key_positions(call: AttentionCall) -> Tensor:
    """Absolute positions ``[k_len]`` of the call's keys."""
    return call.key_start + torch.arange(call.k.shape[2], device=call.k.device)


def row_probs(call: AttentionCall, at: Tensor) -> Tensor:
    """Attention probabilities ``[heads, rows, k_len]`` (float64) of the call's query indices ``at [rows]``
    over every key of the call (batch 0); 0 for keys a row does not see."""
    at = at.to(call.q.device)
    q = call.q[0][:, at].double()  # [heads, rows, qk_dim]
    k = _kv(call, call.k[0].double())  # [heads, k_len, qk_dim]
    s = (q @ k.transpose(-1, -2)) * call.scale
    seen = CausalMask(call.window).visible(row_positions(call, at)[:, None], key_positions(call)[None, :])
    return torch.softmax(s.masked_fill(~seen, -torch.inf), -1)


def row_lse(call: AttentionCall, at: Tensor) -> Tensor:
    """``[heads, rows]`` each query index ``at``'s log-sum-exp over the keys it sees, from one streaming pass
    (:func:`~headprobe.stats.attention_stats`; in float32 for a float32 model)."""
    at = at.to(call.q.device)
    return attention_stats(call.q, call.k, window=call.window, scale=call.scale, rows=at, topk=0).lse[0].double()


def key_probs(call: AttentionCall, at: Tensor, keys: Tensor, lse: Tensor | None = None) -> Tensor:
    """Attention probabilities ``[heads, rows, n]`` (float64) of chosen keys: at query index ``at[i]`` the keys of
    absolute positions ``keys[i] [n]`` (``-1``: none, probability 0). Each row's log-sum-exp ``lse [heads, rows]``
    (:func:`row_lse` unless given); then ``p = exp(scale * q . k - lse)`` for the chosen keys alone, ``ROW_BLOCK``
    rows at a time."""
    at, keys = at.to(call.q.device), keys.to(call.q.device)
    lse = row_lse(call, at) if lse is None else lse
    k_all = _kv(call, call.k[0])
    out = torch.zeros(call.q.shape[1], len(at), keys.shape[1], dtype=torch.float64)
    pos = row_positions(call, at)
    for lo in range(0, len(at), ROW_BLOCK):
        hi = min(lo + ROW_BLOCK, len(at))
        want = keys[lo:hi]  # [b, n] absolute
        index = (want - call.key_start).clamp(0, call.k.shape[2] - 1)
        seen = (want >= call.key_start) & CausalMask(call.window).visible(pos[lo:hi, None], want)
        q = call.q[0][:, at[lo:hi]].double()  # [heads, b, qk_dim]
        k = k_all[:, index].double()  # [heads, b, n, qk_dim]
        s = torch.einsum("hbd,hbnd->hbn", q, k) * call.scale
        p = torch.exp(s - lse[:, lo:hi, None])
        out[:, lo:hi] = torch.where(seen[None], p, torch.zeros_like(p)).cpu()
    return out
