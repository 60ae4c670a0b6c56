"""Exact per-row attention statistics in one streaming pass, without an ``L x L`` matrix.

For one head and query row ``i`` with visible keys ``V(i)`` (see :mod:`trainer.masks`), scores
``s_ij = scale * <q_i, k_j>`` and ``p_ij = softmax_{j in V(i)} s_ij``, the pass over key tiles keeps

    m  running max of s            l = sum_j e^(s_ij - m)         A = sum_j e^(s_ij - m) (s_ij - m)
    D  = sum_j e^(s_ij - m) (i - j)  S[s] = sum_{j in span s} e^(s_ij - m)    running top-k of s

and rescales them by ``e^(m_old - m_new)`` whenever a tile raises the max (the relative form of ``A``
avoids cancellation against ``m``). At the end

    lse = m + log l     entropy = log l - A / l (nats)     max_prob = 1 / l     mean_distance = D / l
    span_mass = S / l   norm_entropy = entropy / log |V(i)| (0 when |V(i)| = 1)
    argmax = the first j with the largest s_ij (ties go to the smallest j)

Rows are processed in blocks and each block visits only the key tiles some of its rows can see, so
the work is ``O(rows x visible keys x dim)`` and the extra memory ``O(heads x row_block x chunk)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from trainer.masks import CausalMask


@dataclass
class AttentionStats:
    """Per-row statistics, each ``[batch, heads, n_rows]`` (trailing ``n_spans`` or ``k`` where noted).

    Attributes:
        positions: ``[n_rows]`` absolute key position of each analysed query row.
        lse: log-sum-exp of the visible scores.
        entropy: attention entropy in nats.
        norm_entropy: entropy / log(number of visible keys).
        max_prob: largest attention probability.
        argmax: key position of the largest score (first one on ties).
        mean_distance: expected distance ``i - j`` under the attention distribution.
        span_mass: ``[..., n_spans]`` attention mass on each requested key span.
        topk_idx: ``[..., k]`` key positions of the ``k`` largest probabilities, largest first.
        topk_prob: ``[..., k]`` their probabilities (``0`` with index ``-1`` where fewer keys are visible).
        visible: ``[n_rows]`` number of visible keys per row.
    """

    positions: Tensor
    lse: Tensor
    entropy: Tensor
    norm_entropy: Tensor
    max_prob: Tensor
    argmax: Tensor
    mean_distance: Tensor
    span_mass: Tensor
    topk_idx: Tensor
    topk_prob: Tensor
    visible: Tensor

    def to(self, device: torch.device | str) -> AttentionStats:
        return AttentionStats(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


def _default_chunk(heads: int, rows: int, device: torch.device) -> int:
    """Key-tile width keeping one score tile near 4M elements (16 MiB in float32; a few temporaries of
    that size live at once)."""
    budget = 1 << 22
    return max(64, min(8192, budget // max(1, heads * min(rows, 1024))))


def attention_stats(
    q: Tensor,
    k: Tensor,
    *,
    window: int | None = None,
    scale: float | None = None,
    rows: Tensor | None = None,
    spans: list[tuple[int, int]] | None = None,
    topk: int = 16,
    chunk: int | None = None,
    row_block: int = 1024,
) -> AttentionStats:
    """Exact attention statistics of every head for the chosen query rows (see module docstring).

    Args:
        q: ``[batch, heads, q_len, qk_dim]`` post-RoPE queries, the last ``q_len`` positions of the keys.
        k: ``[batch, kv_heads, k_len, qk_dim]`` post-RoPE keys (``heads`` a multiple of ``kv_heads``).
        window: keys visible per query including its own; ``None`` = full causal.
        scale: score scale; default ``1/sqrt(qk_dim)``.
        rows: 1-D indices into the ``q_len`` queries to analyse (default: all).
        spans: half-open key-position ranges ``(start, end)`` whose attention mass to report.
        topk: how many top keys to keep per row (0 = none).
        chunk: key-tile width (default: sized to keep a score tile near 16 MiB).
        row_block: query rows handled together.

    Returns:
        :class:`AttentionStats`; computed in float32 (float64 inputs stay float64).
    """
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q must be [batch, heads, q_len, dim] and k [batch, kv_heads, k_len, dim]; got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    b, h, q_len, dim = q.shape
    hkv, k_len = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != dim:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or width")
    if h % hkv:
        raise ValueError(f"heads={h} is not a multiple of kv_heads={hkv}")
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} > k_len={k_len}: queries must be the last keys")
    mask = CausalMask(window)
    scale = dim**-0.5 if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    device = q.device
    offset = k_len - q_len
    rows = torch.arange(q_len, device=device) if rows is None else torch.as_tensor(rows, device=device).long()
    if rows.dim() != 1 or (len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= q_len)):
        raise ValueError(f"rows must be a 1-D tensor of query indices in [0, {q_len})")
    spans = list(spans or [])
    for start, end in spans:
        if not 0 <= start < end <= k_len:
            raise ValueError(f"span ({start}, {end}) is not a non-empty range inside [0, {k_len})")
    topk = int(topk)
    chunk = chunk or _default_chunk(h, min(len(rows), row_block), device)
    groups = h // hkv
    n = len(rows)

    out = {
        "lse": torch.empty(b, h, n, dtype=work, device=device),
        "entropy": torch.empty(b, h, n, dtype=work, device=device),
        "max_prob": torch.empty(b, h, n, dtype=work, device=device),
        "argmax": torch.empty(b, h, n, dtype=torch.long, device=device),
        "mean_distance": torch.empty(b, h, n, dtype=work, device=device),
        "span_mass": torch.empty(b, h, n, len(spans), dtype=work, device=device),
        "topk_idx": torch.full((b, h, n, topk), -1, dtype=torch.long, device=device),
        "topk_prob": torch.zeros(b, h, n, topk, dtype=work, device=device),
    }
    positions = rows + offset
    order = torch.argsort(positions)  # blocks of nearby rows share key tiles
    for block_start in range(0, n, row_block):
        sel = order[block_start : block_start + row_block]
        pos = positions[sel]
        lo = mask.key_range(int(pos.min()))[0]
        hi = int(pos.max()) + 1
        qb = q[:, :, rows[sel]].to(work)  # [b, h, r, d]
        r = len(sel)
        qg = qb.reshape(b, hkv, groups * r, dim)  # query heads of one kv head side by side
        m = torch.full((b, h, r), -math.inf, dtype=work, device=device)
        l_sum = torch.zeros(b, h, r, dtype=work, device=device)
        a_sum = torch.zeros_like(l_sum)
        d_sum = torch.zeros_like(l_sum)
        s_sum = torch.zeros(b, h, r, len(spans), dtype=work, device=device)
        arg = torch.zeros(b, h, r, dtype=torch.long, device=device)
        top_s = torch.full((b, h, r, topk), -math.inf, dtype=work, device=device)
        top_i = torch.full((b, h, r, topk), -1, dtype=torch.long, device=device)
        for t0 in range(lo, hi, chunk):
            t1 = min(hi, t0 + chunk)
            kt = k[:, :, t0:t1].to(work)  # [b, hkv, c, d]
            s = (qg @ kt.transpose(-1, -2)).reshape(b, h, r, t1 - t0) * scale
            kpos = torch.arange(t0, t1, device=device)
            visible = mask.visible(pos[:, None], kpos[None, :])  # [r, c]
            s = s.masked_fill(~visible, -math.inf)
            tile_max, _ = s.max(dim=-1)
            new_m = torch.maximum(m, tile_max)
            # rows with nothing visible in this tile keep new_m = m (possibly -inf): guard the exps
            safe_m = torch.where(torch.isfinite(new_m), new_m, torch.zeros_like(new_m))
            alpha = torch.where(torch.isfinite(m), torch.exp(m - safe_m), torch.zeros_like(m))
            e = torch.exp(s - safe_m[..., None])  # masked entries: exp(-inf) = 0
            rel = torch.where(visible, s - safe_m[..., None], torch.zeros_like(s))
            shift = torch.where(torch.isfinite(m), m - safe_m, torch.zeros_like(m))
            a_sum = alpha * (a_sum + shift * l_sum) + (e * rel).sum(-1)
            l_sum = alpha * l_sum + e.sum(-1)
            dist = (pos[:, None] - kpos[None, :]).to(work)
            d_sum = alpha * d_sum + (e * dist).sum(-1)
            for si, (start, end) in enumerate(spans):
                a, z = max(start, t0), min(end, t1)
                part = e[..., a - t0 : z - t0].sum(-1) if a < z else torch.zeros_like(l_sum)
                s_sum[..., si] = alpha * s_sum[..., si] + part
            # argmax: first position of the tile max; replaces the running one only if strictly larger
            first = torch.where(s == tile_max[..., None], kpos, torch.full_like(kpos, hi)).min(dim=-1).values
            arg = torch.where(tile_max > m, first, arg)
            m = new_m
            if topk:
                kk = min(topk, t1 - t0)
                ts, ti = s.topk(kk, dim=-1)  # sorted, largest first
                cat_s = torch.cat([top_s, ts], dim=-1)
                cat_i = torch.cat([top_i, ti + t0], dim=-1)
                top_s, pick = cat_s.topk(topk, dim=-1)
                top_i = cat_i.gather(-1, pick)
        lse = m + torch.log(l_sum)
        out["lse"][..., sel] = lse
        out["entropy"][..., sel] = torch.log(l_sum) - a_sum / l_sum
        out["max_prob"][..., sel] = 1 / l_sum
        out["argmax"][..., sel] = arg
        out["mean_distance"][..., sel] = d_sum / l_sum
        out["span_mass"][:, :, sel] = s_sum / l_sum[..., None]
        if topk:
            prob = torch.exp(top_s - lse[..., None])
            valid = torch.isfinite(top_s)
            out["topk_prob"][:, :, sel] = torch.where(valid, prob, torch.zeros_like(prob))
            out["topk_idx"][:, :, sel] = torch.where(valid, top_i, torch.full_like(top_i, -1))
    n_visible = torch.minimum(positions + 1, torch.full_like(positions, window)) if window else positions + 1
    log_n = torch.log(n_visible.to(work))
    norm = torch.where(
        n_visible > 1,
        out["entropy"] / torch.where(n_visible > 1, log_n, torch.ones_like(log_n)),
        torch.zeros_like(out["entropy"]),
    )
    return AttentionStats(positions=positions, norm_entropy=norm, visible=n_visible, **out)
