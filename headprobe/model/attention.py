"""Causal (optionally sliding-window) attention with several exact backends.

``attention(q, k, v, window=..., scale=..., backend=...)`` with

* ``q``: ``[batch, heads, q_len, qk_dim]``
* ``k``: ``[batch, kv_heads, k_len, qk_dim]`` (``heads`` a multiple of ``kv_heads``: grouped-query)
* ``v``: ``[batch, kv_heads, k_len, v_dim]`` (``v_dim`` may differ from ``qk_dim``)
* returns ``[batch, heads, q_len, v_dim]`` in ``q``'s dtype.

Queries are the last ``q_len`` of the ``k_len`` keys and a window of ``W`` shows ``W`` keys including
the query's own: see :mod:`headprobe.model.masks`, the single place that convention is written down.

Backends (all compute the same function; tests hold each to ``reference``):

==========  =====================================================================================
reference   dense math in the input dtype (float64 works); builds ``q_len x k_len``: tests only
sdpa        PyTorch SDPA. Sliding windows run query blocks against their key band (memory grows as
            ``L * window``, never ``L^2``); windows of at most ``LOCAL_MAX_WINDOW`` (32) keys over a whole
            sequence, without gradients, run as local blocks in batched matmuls (:func:`local_blocks`). On
            CPU, whose fused kernel needs ``qk_dim == v_dim``, ``v`` is zero-padded/split into
            ``qk_dim``-wide chunks so the fused kernel still runs.
            Grouped-query calls after a cache (decode steps) fold each kv head's query heads into
            its query rows and read ``k``/``v`` in place, never copying the cache per step.
flex        FlexAttention (compiled) with a block mask. CPU: forward only (no backward in PyTorch).
flash       flash-attn (CUDA, fp16/bf16, ``qk_dim == v_dim <= 256``); window ``(W-1, 0)``.
triton      our FlashAttention-style kernel (:mod:`headprobe.model.kernels.attention`): any
            ``qk_dim`` and ``v_dim`` up to 1024, fwd + bwd; CUDA, or CPU under Triton's interpreter.
auto        the fastest backend that supports the device, dtype, shapes and gradient need.
==========  =====================================================================================
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from headprobe.core.errors import HeadprobeError
from headprobe.model.config import Backend
from headprobe.model.masks import CausalMask, KeyPadding

MAX_PADDED_Q_LEN = 64


class AttentionBackendError(HeadprobeError, RuntimeError):
    """The requested backend cannot run these inputs; the message names the limit and an alternative."""


@dataclass(frozen=True)
class AttentionShape:
    """What a backend needs to know to decide whether it can run a call."""

    batch: int
    heads: int
    kv_heads: int
    q_len: int
    k_len: int
    qk_dim: int
    v_dim: int
    dtype: torch.dtype
    device: torch.device
    needs_grad: bool

    @classmethod
    def of(cls, q: Tensor, k: Tensor, v: Tensor) -> AttentionShape:
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise ValueError(
                "attention expects q [batch, heads, q_len, qk_dim], k [batch, kv_heads, k_len, qk_dim], "
                f"v [batch, kv_heads, k_len, v_dim]; got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                f"{tuple(v.shape)}"
            )
        b, h, lq, dqk = q.shape
        bk, hkv, lk, dk = k.shape
        if (bk, hkv, lk) != tuple(v.shape[:3]) or bk != b:
            raise ValueError(
                f"k {tuple(k.shape)} and v {tuple(v.shape)} disagree with q {tuple(q.shape)} "
                "in batch, kv_heads or k_len"
            )
        if dk != dqk:
            raise ValueError(f"q has qk_dim={dqk} but k has {dk}: queries and keys must have one width")
        if h % hkv:
            raise ValueError(f"heads={h} is not a multiple of kv_heads={hkv}")
        if lq > lk:
            raise ValueError(f"q_len={lq} > k_len={lk}: queries must be the last q_len of the keys")
        if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
            raise ValueError("q, k and v must share dtype and device")
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return cls(b, h, hkv, lq, lk, dqk, v.shape[-1], q.dtype, q.device, needs_grad)


def _expand_kv(x: Tensor, heads: int) -> Tensor:
    """``[B, Hkv, L, D] -> [B, heads, L, D]``: query head ``h`` reads kv head ``h // (heads // Hkv)``.

    A copy of the keys or values ``heads // Hkv`` times over: only for whole-sequence causal calls, where
    it is ``O(L)`` beside ``O(L^2)`` attention. Calls after a cache fold the groups into the query rows
    (:func:`_fold_groups`) and read the cache in place.
    """
    groups = heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def _fold_groups(q: Tensor, kv_heads: int) -> Tensor:
    """``q: [B, heads, Lq, D] -> [B, kv_heads, groups * Lq, D]``, row ``g * Lq + i`` being query ``i`` of head
    ``kv * groups + g``: every query head that reads one kv head, stacked as rows against that head.

    A view when ``Lq == 1`` or ``q`` is contiguous, else a copy of ``q`` (small beside the keys)."""
    b, h, lq, d = q.shape
    return q.reshape(b, kv_heads, (h // kv_heads) * lq, d)


def _unfold_groups(out: Tensor, heads: int) -> Tensor:
    """Inverse of :func:`_fold_groups` on the output: ``[B, kv_heads, groups * Lq, Dv] -> [B, heads, Lq, Dv]``."""
    b, hkv, rows, dv = out.shape
    return out.reshape(b, heads, rows // (heads // hkv), dv)


# ---------------------------------------------------------------------------------------------
# reference
# ---------------------------------------------------------------------------------------------
class ReferenceBackend:
    """Dense ``softmax(q k^T * scale + mask) v``; the ground truth. Memory ``O(heads * q_len * k_len)``.

    Also the path for left-padded batches (:class:`headprobe.model.masks.KeyPadding`) during decoding, where
    ``q_len`` is 1 and the dense scores are one row per head.
    """

    name = "reference"

    def unsupported(self, s: AttentionShape, mask: CausalMask) -> str | None:
        return None

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float, key_valid: Tensor | None = None
    ) -> Tensor:
        b, h, lq, _ = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        # grouped-query heads folded into the query rows: [B, Hkv, groups * Lq, D] against [B, Hkv, Lk, D].
        # (Broadcasting [B, Hkv, groups, Lq, D] @ [B, Hkv, 1, D, Lk] instead makes matmul copy k groups times.)
        scores = (_fold_groups(q.to(work), hkv) @ k.to(work).transpose(-1, -2)) * scale
        scores = scores.view(b, hkv, h // hkv, lq, lk)
        visible = mask.dense(lq, lk, device=q.device)  # [Lq, Lk]
        if key_valid is not None:
            visible = visible & key_valid[:, None, None, None, :]  # [B, 1, 1, Lq, Lk]
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out = probs.view(b, hkv, -1, lk) @ v.to(work)  # [B, Hkv, groups * Lq, Dv]
        return _unfold_groups(out, h).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# sdpa
# ---------------------------------------------------------------------------------------------
_FUSED_SDPA_CPU = [SDPBackend.FLASH_ATTENTION]
_FUSED_SDPA_CUDA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]


class SdpaBackend:
    """PyTorch ``scaled_dot_product_attention`` without any ``L x L`` tensor.

    * full causal, ``q_len == k_len``: one call with ``is_causal=True`` (fused kernels tile it);
    * ``q_len == 1``: one call without a mask against the keys the query can see;
    * a window of at most ``LOCAL_MAX_WINDOW`` keys over a whole sequence, without gradients:
      :func:`local_blocks` (:func:`local_applies`);
    * otherwise (wider sliding windows, or a query block after a cache): query blocks of ``block_q`` rows,
      each against only the keys some row of the block can see, with a ``block_q x band`` mask.

    Grouped-query heads: the whole-sequence causal call runs on keys/values expanded to ``heads``;
    every other call folds each kv head's query heads into its rows (``[B, kv_heads, groups * rows, D]``,
    the mask's rows repeated per group) and reads ``k``/``v`` in place, so a decode step never copies
    the cache.

    Only SDPA's fused kernels are allowed; inputs that none accepts raise instead of silently taking
    the math kernel, which materialises ``L x L``.
    """

    name = "sdpa"

    def __init__(self, block_q: int = 256) -> None:
        self.block_q = block_q

    def unsupported(self, s: AttentionShape, mask: CausalMask) -> str | None:
        return None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        """``q: [B, heads, q_len, qk_dim]``, ``k: [B, kv_heads, k_len, qk_dim]``,
        ``v: [B, kv_heads, k_len, v_dim]`` -> ``[B, heads, q_len, v_dim]``."""
        h = q.shape[1]
        if local_applies(q, k, v, mask):
            return local_blocks(q, k, v, mask, scale)
        if q.shape[2] == k.shape[2] and mask.covers(k.shape[2]):
            # the one is_causal call over a whole sequence cannot fold groups into rows (its mask is by row)
            k, v = _expand_kv(k, h), _expand_kv(v, h)
        qk_dim, v_dim = q.shape[-1], v.shape[-1]
        if v_dim != qk_dim and q.device.type == "cpu":
            # CPU's fused kernel requires v_dim == qk_dim, else SDPA falls back to the L^2 math path.
            # Attention is linear in v: run qk_dim-wide slices of v (views; only a narrower last slice is
            # zero-padded, a copy) and concatenate.
            chunks = list(v.split(qk_dim, dim=-1))
            if chunks[-1].shape[-1] < qk_dim:
                chunks[-1] = F.pad(chunks[-1], (0, qk_dim - chunks[-1].shape[-1]))
            outs = [self._banded(q, k, chunk, mask, scale) for chunk in chunks]
            return torch.cat(outs, dim=-1)[..., :v_dim]
        return self._banded(q, k, v, mask, scale)

    def _banded(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        # fused kernels only: SDPA's math kernel builds the L x L matrix, so refuse rather than use it
        fused = _FUSED_SDPA_CPU if q.device.type == "cpu" else _FUSED_SDPA_CUDA
        try:
            with sdpa_kernel(fused):
                return self._banded_fused(q, k, v, mask, scale)
        except RuntimeError as err:
            if "No available kernel" not in str(err) and "No viable backend" not in str(err):
                raise
            raise AttentionBackendError(
                f"no fused SDPA kernel accepts q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)} "
                f"{q.dtype} on {q.device}, and SDPA's math fallback would build the full L x L matrix; "
                "use backend='flex' (or 'reference' for short inputs)"
            ) from None

    def _banded_fused(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        q_len, k_len = q.shape[2], k.shape[2]
        if q_len == k_len and mask.covers(k_len):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        if q_len == 1:
            lo, _ = mask.key_range(k_len - 1)  # every key in [lo, k_len) is visible: no mask
            return _grouped_sdpa(q, k[:, :, lo:], v[:, :, lo:], None, scale)
        offset = k_len - q_len  # absolute position of query 0
        outs = []
        for start in range(0, q_len, self.block_q):
            stop = min(q_len, start + self.block_q)
            lo, _ = mask.key_range(offset + start)
            hi = offset + stop
            q_pos = torch.arange(offset + start, offset + stop, device=q.device)[:, None]
            k_pos = torch.arange(lo, hi, device=q.device)[None, :]
            block_mask = mask.visible(q_pos, k_pos)
            outs.append(_grouped_sdpa(q[:, :, start:stop], k[:, :, lo:hi], v[:, :, lo:hi], block_mask, scale))
        return torch.cat(outs, dim=2)


LOCAL_MAX_WINDOW = 32  # windows up to this many keys over a whole sequence run as local blocks (see below)
LOCAL_MIN_BLOCK = 16


def local_applies(q: Tensor, k: Tensor, v: Tensor, mask: CausalMask) -> bool:
    """Whether :meth:`SdpaBackend.__call__` runs :func:`local_blocks`: a window of at most ``LOCAL_MAX_WINDOW``
    keys over a whole sequence, without gradients. Training keeps SDPA's kernel: a model's training is
    sensitive to float rounding (whether a toy seed learns to retrieve depends on it, docs/training.md),
    and the toys' step gains only 1-2% (docs/benchmarks.md), so trained runs keep their numbers."""
    if q.shape[2] != k.shape[2] or mask.window is None or not mask.window <= LOCAL_MAX_WINDOW < k.shape[2]:
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))


def local_blocks(q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
    """A narrow sliding window over a whole sequence (``q_len == k_len``, ``window <= LOCAL_MAX_WINDOW``) in
    plain batched matmuls: queries in blocks of ``C = max(LOCAL_MIN_BLOCK, window - 1)`` rows, each block
    against its own and the previous block's keys (``2C``: every key a row can see), masked by
    :meth:`CausalMask.visible`. Time and memory ``O(L * C)``; exact as every backend. At such windows it is
    1.3-2.8x faster than SDPA's fused kernel on the blocks' bands, forward and backward (CPU,
    ``benchmarks/attention.py``), whose fixed cost per call dominates a band a few keys wide.

    Shapes as :meth:`SdpaBackend.__call__`; grouped-query heads read their kv head in place (each kv head's
    query heads are stacked as rows of its blocks)."""
    b, h, n, dq = q.shape
    hkv, dv = k.shape[1], v.shape[-1]
    g = h // hkv
    c = max(LOCAL_MIN_BLOCK, (mask.window or 1) - 1)
    blocks = -(-n // c)
    pad = blocks * c - n
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    # queries [B, Hkv, blocks, G * C, Dq]: row g * C + r of block j is query j * C + r of head kv * G + g
    qb = F.pad(q.to(work), (0, 0, 0, pad)).reshape(b, hkv, g, blocks, c, dq)
    qb = qb.transpose(2, 3).reshape(b, hkv, blocks, g * c, dq)

    def pairs(x: Tensor) -> Tensor:
        """``[B, Hkv, L, D] -> [B, Hkv, blocks, 2C, D]``: block ``j``'s keys ``(j-1)C .. (j+1)C - 1``."""
        xb = F.pad(x.to(work), (0, 0, c, pad)).reshape(b, hkv, blocks + 1, c, x.shape[-1])  # an empty block first
        return torch.cat([xb[:, :, :-1], xb[:, :, 1:]], dim=3)

    scores = (qb @ pairs(k).transpose(-1, -2)) * scale  # [B, Hkv, blocks, G * C, 2C]
    start = torch.arange(blocks, device=q.device)[:, None, None] * c
    q_pos = start + torch.arange(c, device=q.device).repeat(g)[None, :, None]  # [blocks, G * C, 1]
    k_pos = start - c + torch.arange(2 * c, device=q.device)[None, None, :]  # [blocks, 1, 2C]
    visible = mask.visible(q_pos, k_pos) & (k_pos >= 0)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    out = probs @ pairs(v)  # [B, Hkv, blocks, G * C, Dv]
    out = out.view(b, hkv, blocks, g, c, dv).transpose(2, 3).reshape(b, h, blocks * c, dv)
    return out[:, :, :n].to(q.dtype)


def _grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """One SDPA call with grouped-query heads folded into the query rows, ``k``/``v`` read in place.

    Args:
        q: ``[B, heads, rows, qk_dim]``.
        k: ``[B, kv_heads, keys, qk_dim]``.
        v: ``[B, kv_heads, keys, v_dim]``.
        mask: ``[rows, keys]`` bool (``True`` = visible) or ``None``.

    Returns:
        ``[B, heads, rows, v_dim]``.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    if heads == kv_heads:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if mask is not None:
        mask = mask.repeat(heads // kv_heads, 1)  # folded row g * rows + i is query row i
    out = F.scaled_dot_product_attention(_fold_groups(q, kv_heads), k, v, attn_mask=mask, scale=scale)
    return _unfold_groups(out, heads)


# ---------------------------------------------------------------------------------------------
# flex
# ---------------------------------------------------------------------------------------------
def _flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


@functools.lru_cache(maxsize=64)
def _flex_block_mask(window: int | None, q_len: int, k_len: int, device: str):
    from torch.nn.attention.flex_attention import create_block_mask

    cm = CausalMask(window)
    offset = k_len - q_len

    def mask_mod(b, h, q_idx, kv_idx):
        return cm.visible(q_idx + offset, kv_idx)

    return create_block_mask(mask_mod, None, None, q_len, k_len, device=device)


@functools.lru_cache(maxsize=1)
def _compiled_flex() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=None: after a second sequence length it compiles a dynamic-shape kernel instead of
    # recompiling per length (past dynamo's recompile limit flex would run eagerly, i.e. L^2)
    return torch.compile(flex_attention)


class FlexBackend:
    """FlexAttention with a block mask that skips fully masked tiles.

    Compiled by default: eager FlexAttention materialises the full score matrix. ``compile=False``
    is for small correctness checks only.
    """

    name = "flex"

    def __init__(self, compile: bool = True) -> None:
        self.compile = compile

    def unsupported(self, s: AttentionShape, mask: CausalMask) -> str | None:
        if not _flex_available():
            return "FlexAttention needs PyTorch >= 2.5; use backend='sdpa'"
        if s.device.type == "cpu" and s.needs_grad:
            return (
                "FlexAttention has no backward pass on CPU; use backend='sdpa' for training on CPU "
                "(or run under torch.no_grad())"
            )
        return None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        block_mask = _flex_block_mask(mask.window, q.shape[2], k.shape[2], str(q.device))
        fn = _compiled_flex() if self.compile else flex_attention
        gqa = q.shape[1] != k.shape[1]
        return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)


# ---------------------------------------------------------------------------------------------
# flash
# ---------------------------------------------------------------------------------------------
class FlashBackend:
    """flash-attn 2.x ``flash_attn_func`` (layout ``[B, L, H, D]`` inside)."""

    name = "flash"
    max_dim = 256

    def unsupported(self, s: AttentionShape, mask: CausalMask) -> str | None:
        # shape limits first: they hold whatever machine the call runs on
        if s.qk_dim != s.v_dim:
            return f"flash-attn needs qk_dim == v_dim, got {s.qk_dim} and {s.v_dim}; use backend='flex' or 'sdpa'"
        if s.qk_dim > self.max_dim or s.qk_dim % 8:
            return (
                f"flash-attn supports head widths <= {self.max_dim} that are multiples of 8, got "
                f"{s.qk_dim}; use backend='flex' or 'sdpa'"
            )
        if s.dtype not in (torch.float16, torch.bfloat16):
            return f"flash-attn needs float16/bfloat16, got {s.dtype}; use backend='sdpa' or 'flex'"
        if s.device.type != "cuda":
            return f"flash-attn runs on CUDA only, inputs are on {s.device}; use backend='sdpa'"
        if importlib.util.find_spec("flash_attn") is None:
            return "flash-attn is not installed (pip install 'headprobe[flash]'); use backend='sdpa'"
        if torch.cuda.get_device_capability(s.device)[0] < 8:
            return "flash-attn 2 needs an Ampere or newer GPU (sm80+); use backend='sdpa'"
        return None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        from flash_attn import flash_attn_func

        out = flash_attn_func(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            softmax_scale=scale,
            causal=True,
            window_size=mask.flash_window_size(),
        )
        return out.transpose(1, 2)


# ---------------------------------------------------------------------------------------------
# triton
# ---------------------------------------------------------------------------------------------
TRITON_MAX_DIM = 1024  # as headprobe.model.kernels.attention.MAX_DIM (that module imports triton)


class TritonBackend:
    """Our Triton kernel (:mod:`headprobe.model.kernels.attention`): every head shape up to width 1024,
    forward and backward, sliding windows visiting only their band."""

    name = "triton"

    def unsupported(self, s: AttentionShape, mask: CausalMask) -> str | None:
        from headprobe.model.kernels.runtime import unsupported_device

        if max(s.qk_dim, s.v_dim) > TRITON_MAX_DIM:
            return f"the triton kernel takes widths up to {TRITON_MAX_DIM}, got {s.qk_dim}/{s.v_dim}; use 'sdpa'"
        why = unsupported_device(s.device, s.dtype)
        return None if why is None else f"{why}; or use backend='sdpa'"

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: CausalMask, scale: float) -> Tensor:
        from headprobe.model.kernels.attention import triton_attention

        return triton_attention(q, k, v, window=mask.window, scale=scale)[0]


BACKENDS: dict[Backend, ReferenceBackend | SdpaBackend | FlexBackend | FlashBackend | TritonBackend] = {
    Backend.REFERENCE: ReferenceBackend(),
    Backend.SDPA: SdpaBackend(),
    Backend.FLEX: FlexBackend(),
    Backend.FLASH: FlashBackend(),
    Backend.TRITON: TritonBackend(),
}


def planned_backend(qk_dim: int, v_dim: int) -> Backend:
    """The backend ``auto`` takes on a CUDA GPU with flash-attn and Triton installed, for a bf16 layer of
    this head shape: ``flash`` where it applies (equal widths <= 256, multiples of 8), else ``triton``."""
    flash = BACKENDS[Backend.FLASH]
    if qk_dim == v_dim and qk_dim <= flash.max_dim and qk_dim % 8 == 0:
        return Backend.FLASH
    return Backend.TRITON


def _auto_order(s: AttentionShape, mask: CausalMask) -> list[Backend]:
    if s.device.type == "cuda":
        # flash where it applies, else our triton kernel (every head shape, windows by band); where
        # neither can run (no flash-attn, no triton): flex skips the masked tiles of a sliding window
        # over a whole sequence (not for decode steps or cache chunks: every new shape would recompile
        # it); SDPA (its mem-efficient kernel accepts qk_dim != v_dim and widths above 256) for the rest.
        windowed_sequence = not mask.covers(s.k_len) and s.q_len == s.k_len
        if windowed_sequence:
            return [Backend.FLASH, Backend.TRITON, Backend.FLEX, Backend.SDPA]
        return [Backend.FLASH, Backend.TRITON, Backend.SDPA]
    return [Backend.SDPA]  # CPU: triton runs there only interpreted (slow), so only when asked for


def select_backend(
    q: Tensor, k: Tensor, v: Tensor, *, window: int | None = None, backend: Backend | str = Backend.AUTO
) -> Backend:
    """The backend ``attention`` would run for these inputs (raises if it cannot)."""
    s = AttentionShape.of(q, k, v)
    mask = CausalMask(window)
    backend = Backend(backend)
    if backend is Backend.AUTO:
        reasons = []
        for name in _auto_order(s, mask):
            why = BACKENDS[name].unsupported(s, mask)
            if why is None:
                return name
            reasons.append(f"{name.value}: {why}")
        raise AttentionBackendError("no attention backend can run these inputs:\n  " + "\n  ".join(reasons))
    why = BACKENDS[backend].unsupported(s, mask)
    if why is not None:
        raise AttentionBackendError(
            f"backend {backend.value!r} cannot run q{tuple(q.shape)} "
            f"k{tuple(k.shape)} v{tuple(v.shape)} {s.dtype} on {s.device}: {why}"
        )
    return backend


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    window: int | None = None,
    scale: float | None = None,
    backend: Backend | str = Backend.AUTO,
    padding: KeyPadding | None = None,
) -> Tensor:
    """Causal attention; see the module docstring for shapes, the window convention and backends.

    Args:
        q: ``[batch, heads, q_len, qk_dim]``, the last ``q_len`` positions of the keys.
        k: ``[batch, kv_heads, k_len, qk_dim]``.
        v: ``[batch, kv_heads, k_len, v_dim]``.
        window: keys visible to each query including its own; ``None`` = full causal.
        scale: softmax temperature; default ``1/sqrt(qk_dim)``.
        backend: ``auto`` | ``reference`` | ``sdpa`` | ``flex`` | ``flash`` | ``triton``.
        padding: left padding of a batch of different-length rows (batched decoding); such calls run
            the dense reference path, so ``q_len`` must be small (at most ``MAX_PADDED_Q_LEN``).

    Returns:
        ``[batch, heads, q_len, v_dim]`` in ``q``'s dtype.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if padding is not None:
        AttentionShape.of(q, k, v)
        if Backend(backend) not in (Backend.AUTO, Backend.REFERENCE):
            raise AttentionBackendError(f"left-padded batches run on the reference backend, not {backend!r}")
        if q.shape[2] > MAX_PADDED_Q_LEN:
            raise AttentionBackendError(
                f"left-padded batches are for decoding (q_len <= {MAX_PADDED_Q_LEN}), got q_len={q.shape[2]}; "
                "prefill each sequence on its own and stack the caches (KVCache.stack)"
            )
        if padding.start.shape != (q.shape[0],):
            raise ValueError(f"padding.start must be [batch]={q.shape[0]}, got {tuple(padding.start.shape)}")
        return BACKENDS[Backend.REFERENCE](q, k, v, CausalMask(window), scale, key_valid=padding.valid(k.shape[2]))
    name = select_backend(q, k, v, window=window, backend=backend)
    return BACKENDS[name](q, k, v, CausalMask(window), scale)
