"""The streaming attention statistics as one fused Triton kernel (the ``triton`` entry of
:mod:`headprobe.stats.tiles`).

One program per (block of analysed query rows, batch x head) keeps its rows' queries and streams the key
tiles they can see (only the band of a sliding window), keeping the online-softmax accumulators of
:mod:`headprobe.stats.engine` in registers: running max ``m``, ``l = sum e^(s-m)``, the relative
``A = sum e^(s-m) (s-m)``, ``D = sum e^(s-m) (i-j)``, one ``S`` per key span, and the first argmax.
Scores never leave the chip (they are computed in the inputs' precision with float32 accumulation:
exact float32 for float32 inputs, tensor-core products for bfloat16 ones); the result per row is ``lse,
entropy, max_prob, argmax, mean_distance`` and the span masses. Top-k keys are a second pass
(:func:`headprobe.stats.engine.attention_stats`).

CUDA tensors compile; CPU float32 tensors run in Triton's interpreter
(:mod:`headprobe.model.kernels.runtime`).
No ``from __future__ import annotations`` here: Triton reads the ``tl.constexpr`` annotations.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from headprobe.model.kernels.attention import _band, _visible  # the one band and mask rule of our kernels

NEG = -1e30  # as the engine: masked scores, finite so that 0 * NEG stays 0
BLOCK_M = 16  # query rows per program
BLOCK_N = 32  # keys per tile (CUDA: 64)


@triton.jit
def _stats(
    Q, K, ROWS, POS, SPAN_LO, SPAN_HI,
    LSE, ENTROPY, MAX_PROB, ARGMAX, DISTANCE, SPAN_MASS,
    scale, q_len, k_len, n_rows, n_spans,
    HEADS, GROUPS, WINDOW, DIM, WINDOWED: tl.constexpr, PAD: tl.constexpr,
    SPAN_PAD: tl.constexpr, HAS_SPANS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kv = (bh // HEADS) * (HEADS // GROUPS) + (bh % HEADS) // GROUPS
    slot = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # which analysed rows (sorted by position)
    inside = slot < n_rows
    row = tl.load(ROWS + slot, mask=inside, other=0)
    pos = tl.load(POS + slot, mask=inside, other=0)
    d = tl.arange(0, PAD)
    q = tl.load(Q + bh * q_len * DIM + row[:, None] * DIM + d[None, :], mask=inside[:, None] & (d[None, :] < DIM),
                other=0.0)  # fmt: skip
    m = tl.full([BLOCK_M], NEG, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    a = tl.zeros([BLOCK_M], tl.float32)
    dist = tl.zeros([BLOCK_M], tl.float32)
    arg = tl.zeros([BLOCK_M], tl.int64)
    sp = tl.arange(0, SPAN_PAD)
    span_lo = tl.load(SPAN_LO + sp, mask=sp < n_spans, other=0)
    span_hi = tl.load(SPAN_HI + sp, mask=sp < n_spans, other=0)
    spans = tl.zeros([BLOCK_M, SPAN_PAD], tl.float32)
    first = tl.min(tl.where(inside, pos, k_len), 0)
    last = tl.max(tl.where(inside, pos, 0), 0)
    lo, hi = _band(first, last, k_len, WINDOW, WINDOWED, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + kv * k_len * DIM + cols[:, None] * DIM + d[None, :],
                    mask=(cols[:, None] < k_len) & (d[None, :] < DIM), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # float32 accumulation
        seen = _visible(pos, cols, k_len, WINDOW, WINDOWED) & inside[:, None]
        s = tl.where(seen, s, NEG)
        tile_max, tile_arg = tl.max(s, 1, return_indices=True, return_indices_tie_break_left=True)
        new_m = tl.maximum(m, tile_max)
        rel = s - new_m[:, None]
        e = tl.where(seen, tl.exp(rel), 0.0)
        alpha = tl.exp(m - new_m)
        a = alpha * (a + (m - new_m) * l) + tl.sum(e * rel, 1)
        l = alpha * l + tl.sum(e, 1)
        dist = alpha * dist + tl.sum(e * (pos[:, None] - cols[None, :]).to(tl.float32), 1)
        if HAS_SPANS:
            inspan = (cols[:, None] >= span_lo[None, :]) & (cols[:, None] < span_hi[None, :])
            # float32 probabilities against 0/1: IEEE products (TF32 would round e to 10 bits)
            spans = alpha[:, None] * spans + tl.dot(e, inspan.to(tl.float32), input_precision="ieee")
        arg = tl.where(tile_max > m, start + tile_arg.to(tl.int64), arg)  # strict: the first maximum wins
        m = new_m
    l = tl.where(inside, l, 1.0)
    out = bh * n_rows + slot
    tl.store(LSE + out, m + tl.log(l), mask=inside)
    tl.store(ENTROPY + out, tl.log(l) - a / l, mask=inside)
    tl.store(MAX_PROB + out, 1.0 / l, mask=inside)
    tl.store(ARGMAX + out, arg, mask=inside)
    tl.store(DISTANCE + out, dist / l, mask=inside)
    if HAS_SPANS:
        tl.store(SPAN_MASS + out[:, None] * n_spans + sp[None, :], spans / l[:, None],
                 mask=inside[:, None] & (sp[None, :] < n_spans))  # fmt: skip


def fused_stats(
    q: Tensor, k: Tensor, window: int | None, scale: float, rows: Tensor, spans: list[tuple[int, int]]
) -> dict[str, Tensor]:
    """Per-row statistics of the analysed ``rows`` (indices into ``q_len``) in one kernel launch.

    Args:
        q: ``[batch, heads, q_len, dim]`` post-RoPE queries (the last ``q_len`` of the keys).
        k: ``[batch, kv_heads, k_len, dim]`` post-RoPE keys.
        window: keys visible per query including its own; ``None`` = full causal.
        scale: score scale.
        rows: ``[n_rows]`` query indices.
        spans: half-open key ranges whose mass to report.

    Returns:
        float32 ``lse, entropy, max_prob, mean_distance [batch, heads, n_rows]``, int64 ``argmax`` and
        ``span_mass [batch, heads, n_rows, n_spans]``, in the order of ``rows``.
    """
    b, h, q_len, dim = q.shape
    k_len, dev = k.shape[2], q.device
    n = len(rows)
    positions = rows + (k_len - q_len)
    order = torch.argsort(positions)  # nearby rows share key tiles
    f32 = dict(dtype=torch.float32, device=dev)
    out = {name: torch.empty(b, h, n, **f32) for name in ("lse", "entropy", "max_prob", "mean_distance")}
    out["argmax"] = torch.empty(b, h, n, dtype=torch.int64, device=dev)
    out["span_mass"] = torch.zeros(b, h, n, len(spans), **f32)
    lo = torch.tensor([s for s, _ in spans] or [0], dtype=torch.int64, device=dev)
    hi = torch.tensor([e for _, e in spans] or [0], dtype=torch.int64, device=dev)
    block_n = 64 if dev.type == "cuda" else BLOCK_N
    grid = (triton.cdiv(n, BLOCK_M), b * h)
    _stats[grid](
        q.contiguous(), k.contiguous(), rows[order].contiguous(), positions[order].contiguous(), lo, hi,
        out["lse"], out["entropy"], out["max_prob"], out["argmax"], out["mean_distance"], out["span_mass"],
        float(scale), q_len, k_len, n, len(spans),
        HEADS=h, GROUPS=h // k.shape[1], WINDOW=window or 0, DIM=dim, WINDOWED=window is not None,
        PAD=max(16, triton.next_power_of_2(dim)),
        SPAN_PAD=max(16, triton.next_power_of_2(max(1, len(spans)))), HAS_SPANS=bool(spans),
        BLOCK_M=BLOCK_M, BLOCK_N=block_n, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    unsort = torch.argsort(order)
    return {name: t[:, :, unsort] for name, t in out.items()}
