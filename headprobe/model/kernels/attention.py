"""FlashAttention-style attention in Triton for every head shape: forward, backward and the rows' LSE.

Shapes (the project's layout, :mod:`headprobe.model.attention`):

* ``q``: ``[batch, heads, q_len, qk_dim]``; ``k``: ``[batch, kv_heads, k_len, qk_dim]``;
  ``v``: ``[batch, kv_heads, k_len, v_dim]``, ``heads`` a multiple of ``kv_heads`` (grouped-query).
* ``qk_dim`` and ``v_dim`` are independent, each 1 ... 1024 (tiles are padded to a power of two >= 16).
* Causal, queries the last ``q_len`` keys; a window of ``W`` shows keys ``p-W+1 .. p``
  (:mod:`headprobe.model.masks`, the project's one convention).
* Returns ``out [batch, heads, q_len, v_dim]`` in ``q``'s dtype and ``lse [batch, heads, q_len]``
  (float32, natural log) of the scaled, masked scores.

Algorithm (FlashAttention-2):

* forward: one program per (query tile, batch x head) keeps the query tile and streams the key/value
  tiles its rows can see, with a running max ``m``, sum ``l`` and output accumulator rescaled by
  ``exp(m_old - m_new)``. Key tiles outside the band are never visited: a sliding window costs
  ``O(L * W)``, a causal pass half of ``L^2``.
* backward: ``delta_i = sum_d dO_i * O_i``; one program per (key tile, batch x kv head) recomputes
  ``P = exp(S - lse)`` for the query tiles that see it (over every query head of its group, which sums
  grouped-query gradients in place) and accumulates ``dV += P^T dO`` and ``dK += dS^T Q``, where
  ``dS = P * (dO V^T - delta)``; one program per query tile accumulates ``dQ += dS K``. No ``L x L``
  matrix is stored; float32 accumulation throughout.

Tile sizes per shape are in :func:`tiles` (docs/attention.md gives the reasoning); on CUDA the
forward kernel's tiles are autotuned among the candidates near that rule, once per head shape
(``HEADPROBE_TRITON_AUTOTUNE=0`` keeps the fixed ones).
"""

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

TUNED = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")  # what the CUDA forward's autotuner chooses
MAX_DIM = 1024  # widest qk_dim / v_dim: a 1024-wide tile pair still fits sm80/sm90 shared memory at 16 rows


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of one launch: query rows ``block_m``, key rows ``block_n`` and the padded widths."""

    block_m: int
    block_n: int
    qk_pad: int
    v_pad: int
    num_warps: int
    num_stages: int


def _pad(dim: int) -> int:
    return max(16, triton.next_power_of_2(dim))


@functools.cache
def tiles(qk_dim: int, v_dim: int, device_type: str) -> Tiles:
    """Tile sizes for a head shape. Registers and shared memory hold a query tile ``[block_m, qk]``, a
    key tile ``[block_n, qk]``, a value tile ``[block_n, v]`` and the ``[block_m, v]`` float32
    accumulator, so rows shrink as the widest side grows: 64 x 64 up to width 128, 64 x 32 at 256,
    32 x 32 at 512 and 16 x 16 at 1024 (a 16 x 1024 half-precision tile is 32 KiB; the four buffers of
    the widest shape stay under sm80's 164 KiB and sm90's 228 KiB). The interpreter (CPU) uses 16 x 16:
    its cost is per element, and small tiles exercise the band edges in small tests."""
    qk_pad, v_pad = _pad(qk_dim), _pad(v_dim)
    widest = max(qk_pad, v_pad)
    if device_type != "cuda":
        return Tiles(16, 16, qk_pad, v_pad, 1, 1)
    if widest <= 128:
        return Tiles(64, 64, qk_pad, v_pad, 4, 2)
    if widest <= 256:
        return Tiles(64, 32, qk_pad, v_pad, 4, 2)
    if widest <= 512:
        return Tiles(32, 32, qk_pad, v_pad, 4, 1)
    return Tiles(16, 16, qk_pad, v_pad, 4, 1)


# ---------------------------------------------------------------------------------------------
# kernels (compiled for CUDA, or interpreted on CPU: :mod:`headprobe.model.kernels.runtime`)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _band(first, last, k_len, WINDOW, WINDOWED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key tiles ``[lo, hi)`` seen by query positions ``first .. last`` (inclusive), ``lo`` on a tile edge."""
    lo = 0
    if WINDOWED:
        lo = tl.maximum(first - WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    hi = tl.minimum(last + 1, k_len)
    return lo, hi


@triton.jit
def _visible(pos, cols, k_len, WINDOW, WINDOWED: tl.constexpr):
    """``[rows, cols]``: may the query at ``pos`` see key ``cols`` (causal, window, inside the keys)."""
    seen = (cols[None, :] <= pos[:, None]) & (cols[None, :] < k_len)
    if WINDOWED:
        seen = seen & (pos[:, None] - cols[None, :] < WINDOW)
    return seen


@triton.jit
def _fwd(
    Q, K, V, O, LSE, scale, q_len, k_len,
    HEADS, GROUPS, WINDOW, QK_DIM, V_DIM, WINDOWED: tl.constexpr, QK_PAD: tl.constexpr, V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kv = (bh // HEADS) * (HEADS // GROUPS) + (bh % HEADS) // GROUPS  # batch * kv_heads + kv head
    offset = k_len - q_len  # query row i sits at key position offset + i
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = offset + rows
    dq, dv = tl.arange(0, QK_PAD), tl.arange(0, V_PAD)
    q = tl.load(
        Q + bh * q_len * QK_DIM + rows[:, None] * QK_DIM + dq[None, :],
        mask=(rows[:, None] < q_len) & (dq[None, :] < QK_DIM),
        other=0.0,
    )
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, V_PAD], tl.float32)
    lo, hi = _band(offset + pid_m * BLOCK_M, offset + pid_m * BLOCK_M + BLOCK_M - 1, k_len, WINDOW, WINDOWED, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(
            K + kv * k_len * QK_DIM + cols[:, None] * QK_DIM + dq[None, :],
            mask=(cols[:, None] < k_len) & (dq[None, :] < QK_DIM),
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(_visible(pos, cols, k_len, WINDOW, WINDOWED), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that see nothing yet stay at zero
        p = tl.exp(s - base[:, None])
        alpha = tl.exp(m - base)
        v = tl.load(
            V + kv * k_len * V_DIM + cols[:, None] * V_DIM + dv[None, :],
            mask=(cols[:, None] < k_len) & (dv[None, :] < V_DIM),
            other=0.0,
        )
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    l = tl.where(l == 0.0, 1.0, l)  # rows past q_len (never stored) see nothing: no 0/0
    out = acc / l[:, None]
    tl.store(
        O + bh * q_len * V_DIM + rows[:, None] * V_DIM + dv[None, :],
        out.to(O.dtype.element_ty),
        mask=(rows[:, None] < q_len) & (dv[None, :] < V_DIM),
    )
    tl.store(LSE + bh * q_len + rows, m + tl.log(l), mask=rows < q_len)


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, scale, q_len, k_len,
    HEADS, GROUPS, WINDOW, QK_DIM, V_DIM, WINDOWED: tl.constexpr, QK_PAD: tl.constexpr, V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    bkv = tl.program_id(1).to(tl.int64)  # batch * kv_heads + kv head
    kv_heads = HEADS // GROUPS
    offset = k_len - q_len
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dq, dv = tl.arange(0, QK_PAD), tl.arange(0, V_PAD)
    k_mask = (cols[:, None] < k_len) & (dq[None, :] < QK_DIM)
    v_mask = (cols[:, None] < k_len) & (dv[None, :] < V_DIM)
    k = tl.load(K + bkv * k_len * QK_DIM + cols[:, None] * QK_DIM + dq[None, :], mask=k_mask, other=0.0)
    v = tl.load(V + bkv * k_len * V_DIM + cols[:, None] * V_DIM + dv[None, :], mask=v_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, QK_PAD], tl.float32)
    dvacc = tl.zeros([BLOCK_N, V_PAD], tl.float32)
    # query rows that can see keys cols[0] .. cols[-1]: positions from cols[0] (causal) up to
    # cols[-1] + W - 1 (window), as row indices
    lo = tl.maximum(pid_n * BLOCK_N - offset, 0) // BLOCK_M * BLOCK_M
    hi = q_len
    if WINDOWED:
        hi = tl.minimum(q_len, pid_n * BLOCK_N + BLOCK_N - 1 + WINDOW - offset)
    for g in range(GROUPS):
        bh = (bkv // kv_heads) * HEADS + (bkv % kv_heads) * GROUPS + g
        for start in range(lo, hi, BLOCK_M):
            rows = start + tl.arange(0, BLOCK_M)
            pos = offset + rows
            inside = rows < q_len
            q = tl.load(
                Q + bh * q_len * QK_DIM + rows[:, None] * QK_DIM + dq[None, :],
                mask=inside[:, None] & (dq[None, :] < QK_DIM),
                other=0.0,
            )
            do = tl.load(
                DO + bh * q_len * V_DIM + rows[:, None] * V_DIM + dv[None, :],
                mask=inside[:, None] & (dv[None, :] < V_DIM),
                other=0.0,
            )
            lse = tl.load(LSE + bh * q_len + rows, mask=inside, other=0.0)
            delta = tl.load(DELTA + bh * q_len + rows, mask=inside, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            seen = _visible(pos, cols, k_len, WINDOW, WINDOWED) & inside[:, None]
            p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
            dvacc += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    tl.store(DK + bkv * k_len * QK_DIM + cols[:, None] * QK_DIM + dq[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=k_mask)  # fmt: skip
    tl.store(DV + bkv * k_len * V_DIM + cols[:, None] * V_DIM + dv[None, :], dvacc.to(DV.dtype.element_ty),
             mask=v_mask)  # fmt: skip


@triton.jit
def _bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, scale, q_len, k_len,
    HEADS, GROUPS, WINDOW, QK_DIM, V_DIM, WINDOWED: tl.constexpr, QK_PAD: tl.constexpr, V_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    kv = (bh // HEADS) * (HEADS // GROUPS) + (bh % HEADS) // GROUPS
    offset = k_len - q_len
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pos = offset + rows
    inside = rows < q_len
    dq, dv = tl.arange(0, QK_PAD), tl.arange(0, V_PAD)
    q_mask = inside[:, None] & (dq[None, :] < QK_DIM)
    q = tl.load(Q + bh * q_len * QK_DIM + rows[:, None] * QK_DIM + dq[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + bh * q_len * V_DIM + rows[:, None] * V_DIM + dv[None, :],
                 mask=inside[:, None] & (dv[None, :] < V_DIM), other=0.0)  # fmt: skip
    lse = tl.load(LSE + bh * q_len + rows, mask=inside, other=0.0)
    delta = tl.load(DELTA + bh * q_len + rows, mask=inside, other=0.0)
    acc = tl.zeros([BLOCK_M, QK_PAD], tl.float32)
    lo, hi = _band(offset + pid_m * BLOCK_M, offset + pid_m * BLOCK_M + BLOCK_M - 1, k_len, WINDOW, WINDOWED, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + kv * k_len * QK_DIM + cols[:, None] * QK_DIM + dq[None, :],
                    mask=(cols[:, None] < k_len) & (dq[None, :] < QK_DIM), other=0.0)  # fmt: skip
        v = tl.load(V + kv * k_len * V_DIM + cols[:, None] * V_DIM + dv[None, :],
                    mask=(cols[:, None] < k_len) & (dv[None, :] < V_DIM), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        seen = _visible(pos, cols, k_len, WINDOW, WINDOWED) & inside[:, None]
        p = tl.where(seen, tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        acc += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    tl.store(DQ + bh * q_len * QK_DIM + rows[:, None] * QK_DIM + dq[None, :], (acc * scale).to(DQ.dtype.element_ty),
             mask=q_mask)  # fmt: skip


def _candidates() -> list:
    """Forward tile candidates the CUDA autotuner times once per head shape (the first call of a shape
    pays for it); configurations that do not fit shared memory are skipped by Triton."""
    out = []
    for block_m, block_n in ((128, 64), (64, 64), (64, 32), (32, 32), (32, 16), (16, 16)):
        for warps in (4, 8):
            out.append(triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps, num_stages=2))
    return out


def _prune(configs: list, named_args: dict, **kwargs: object) -> list:
    """Keep the candidates whose tiles fit the shape's width (the :func:`tiles` rule, one step either side)."""
    given = {**named_args, **kwargs}  # Triton passes positional arguments as named_args, keywords apart
    widest = max(given["QK_PAD"], given["V_PAD"])
    rows = {128: 128, 256: 64, 512: 32}.get(widest, 16 if widest > 512 else 128)
    return [c for c in configs if c.kwargs["BLOCK_M"] <= rows and c.kwargs["BLOCK_M"] * 4 >= rows] or configs[-2:]


_fwd_tuned = triton.autotune(
    configs=_candidates(), key=["QK_PAD", "V_PAD", "WINDOWED"], prune_configs_by={"early_config_prune": _prune}
)(_fwd)
AUTOTUNE = os.environ.get("HEADPROBE_TRITON_AUTOTUNE", "1") != "0"  # 0: the fixed tiles() on CUDA too


# ---------------------------------------------------------------------------------------------
# launches and autograd
# ---------------------------------------------------------------------------------------------
def _common(q: Tensor, k: Tensor, v: Tensor, window: int | None) -> dict[str, object]:
    """The shape arguments every kernel of one call shares. Only the tile sizes, padded widths, whether
    there is a window and the dot precision are compile-time constants (``tl.constexpr``): one compiled
    kernel serves every length, head count and window width of a head shape."""
    t = tiles(q.shape[-1], v.shape[-1], q.device.type)
    return dict(
        HEADS=q.shape[1],
        GROUPS=q.shape[1] // k.shape[1],
        WINDOW=window or 0,
        QK_DIM=q.shape[-1],
        V_DIM=v.shape[-1],
        WINDOWED=window is not None,
        QK_PAD=t.qk_pad,
        V_PAD=t.v_pad,
        BLOCK_M=t.block_m,
        BLOCK_N=t.block_n,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        **({"num_warps": t.num_warps, "num_stages": t.num_stages} if q.device.type == "cuda" else {}),
    )


def forward(q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of causal attention (contiguous inputs; see the module docstring for shapes)."""
    b, h, q_len, _ = q.shape
    k_len = k.shape[2]
    out = torch.empty(b, h, q_len, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h, q_len, dtype=torch.float32, device=q.device)
    c = _common(q, k, v, window)
    if q.device.type == "cuda" and AUTOTUNE:
        fixed = {name: value for name, value in c.items() if name not in TUNED}
        _fwd_tuned[lambda meta: (triton.cdiv(q_len, meta["BLOCK_M"]), b * h)](
            q, k, v, out, lse, scale, q_len, k_len, **fixed
        )
        return out, lse
    grid = (triton.cdiv(q_len, c["BLOCK_M"]), b * h)
    _fwd[grid](q, k, v, out, lse, scale, q_len, k_len, **c)
    return out, lse


def backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, window: int | None, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` given the forward's ``out`` and ``lse`` and the output gradient ``dout``."""
    b, h, q_len, _ = q.shape
    hkv, k_len = k.shape[1], k.shape[2]
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1)  # [b, h, q_len]: rowsum(dO * O)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    c = _common(q, k, v, window)
    grid_kv = (triton.cdiv(k_len, c["BLOCK_N"]), b * hkv)
    _bwd_dkdv[grid_kv](q, k, v, dout, lse, delta, dk, dv, scale, q_len, k_len, **c)
    grid_q = (triton.cdiv(q_len, c["BLOCK_M"]), b * h)
    _bwd_dq[grid_q](q, k, v, dout, lse, delta, dq, scale, q_len, k_len, **c)
    return dq, dk, dv


class _TritonAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, window: int | None, scale: float) -> tuple[Tensor, Tensor]:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = forward(q, k, v, window, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.window, ctx.scale = window, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout: Tensor, _dlse: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, out, lse, dout, ctx.window, ctx.scale)
        return dq, dk, dv, None, None


def triton_attention(
    q: Tensor, k: Tensor, v: Tensor, *, window: int | None = None, scale: float | None = None
) -> tuple[Tensor, Tensor]:
    """Causal attention and its rows' log-sum-exp, differentiable in ``q``, ``k``, ``v``.

    Args:
        q: ``[batch, heads, q_len, qk_dim]``; k: ``[batch, kv_heads, k_len, qk_dim]``;
        v: ``[batch, kv_heads, k_len, v_dim]`` (CUDA: float16/bfloat16/float32; CPU: float32, interpreted).
        window: keys visible per query including its own; ``None`` = full causal.
        scale: score scale; default ``1/sqrt(qk_dim)``.

    Returns:
        ``out [batch, heads, q_len, v_dim]`` (``q``'s dtype) and ``lse [batch, heads, q_len]`` (float32).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _TritonAttention.apply(q, k, v, window, scale)
