"""Exact per-row attention statistics in one streaming pass, without an ``L x L`` matrix.

For one head and query row ``i`` with visible keys ``V(i)`` (see :mod:`headprobe.model.masks`), scores
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

from headprobe.core.errors import SettingError
from headprobe.model.kernels.runtime import unsupported_device
from headprobe.model.masks import CausalMask
from headprobe.stats.tiles import NEG, TileKernel, Tiles, tile_kernel


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


class _Running:
    """The online-softmax accumulators of one block of rows (see the module docstring)."""

    def __init__(self, b: int, h: int, r: int, n_spans: int, topk: int, dtype: torch.dtype, device) -> None:
        def zeros(*shape):
            return torch.zeros(*shape, dtype=dtype, device=device)

        self.m = torch.full((b, h, r), NEG, dtype=dtype, device=device)
        self.l, self.a, self.d, self.s = zeros(b, h, r), zeros(b, h, r), zeros(b, h, r), zeros(b, h, r, n_spans)
        self.arg = torch.zeros(b, h, r, dtype=torch.long, device=device)
        self.topk = topk
        self.top_s = torch.full((b, h, r, topk), -math.inf, dtype=dtype, device=device)
        self.top_i = torch.full((b, h, r, topk), -1, dtype=torch.long, device=device)

    def update(
        self,
        s: Tensor,
        visible: Tensor | None,
        kpos: Tensor,
        pos: Tensor,
        spans: list[tuple[int, int]],
        core: TileKernel | None,
    ) -> None:
        """Fold in one tile of scores ``s [b, h, r, c]`` (``visible [r, c]``, ``None`` = all) at key
        positions ``kpos [c]`` for rows at ``pos [r]``; ``core`` is a :mod:`tile kernel <headprobe.stats.tiles>`
        (``None``: keep only the top-k)."""
        t0, t1 = int(kpos[0]), int(kpos[-1]) + 1
        if self.topk:
            masked = s if visible is None else s.masked_fill(~visible, -math.inf)
            ts, ti = masked.topk(min(self.topk, t1 - t0), dim=-1)
            top_s, pick = torch.cat([self.top_s, ts], dim=-1).topk(self.topk, dim=-1)
            self.top_i = torch.cat([self.top_i, ti + t0], dim=-1).gather(-1, pick)
            self.top_s = top_s
        if core is None:  # top-k only (the fused kernel computes the rest: _fused)
            return
        indicator = None
        if spans:
            indicator = torch.stack([(kpos >= a) & (kpos < z) for a, z in spans], dim=-1).to(s.dtype)  # [c, n]
        new_m, self.l, self.a, self.d, tile_max, tile_arg, span_part = core(
            s, visible, self.m, self.l, self.a, self.d, kpos.to(s.dtype), pos.to(s.dtype), indicator
        )
        if spans:
            self.s = torch.exp(self.m - new_m)[..., None] * self.s + span_part
        self.arg = torch.where(tile_max > self.m, tile_arg + t0, self.arg)
        self.m = new_m

    def finish(self, out: dict[str, Tensor], sel: Tensor) -> None:
        """Write the block's final statistics into the output tensors at rows ``sel``."""
        lse = self.m + torch.log(self.l)
        out["lse"][..., sel] = lse
        out["entropy"][..., sel] = torch.log(self.l) - self.a / self.l
        out["max_prob"][..., sel] = 1 / self.l
        out["argmax"][..., sel] = self.arg
        out["mean_distance"][..., sel] = self.d / self.l
        out["span_mass"][:, :, sel] = self.s / self.l[..., None]
        self.finish_topk(out, sel)

    def finish_topk(self, out: dict[str, Tensor], sel: Tensor) -> None:
        """Write the block's top-k keys and their probabilities (from the ``lse`` in ``out``) at rows ``sel``."""
        if not self.topk:
            return
        valid = torch.isfinite(self.top_s)
        prob = torch.exp(self.top_s - out["lse"][..., sel][..., None])
        out["topk_prob"][:, :, sel] = torch.where(valid, prob, torch.zeros_like(prob))
        out["topk_idx"][:, :, sel] = torch.where(valid, self.top_i, torch.full_like(self.top_i, -1))


def _streamed(pass_: _Pass, out: dict[str, Tensor], rows: Tensor, positions: Tensor, row_block: int) -> None:
    """Every statistic by the tile kernel, block of rows by block of rows (nearby rows share key tiles)."""
    order = torch.argsort(positions)
    for start in range(0, len(rows), row_block):
        sel = order[start : start + row_block]
        pass_.block(rows[sel], positions[sel]).finish(out, sel)


def _fused(pass_: _Pass, out: dict[str, Tensor], rows: Tensor, positions: Tensor, row_block: int) -> None:
    """Every statistic but the top-k by the fused Triton kernel (:mod:`headprobe.stats.triton_stats`) in one
    pass; the top-k, when asked for, by a second pass of tiles that keep only it."""
    from headprobe.stats.triton_stats import fused_stats

    window = pass_.mask.window
    for name, value in fused_stats(pass_.q, pass_.k, window, pass_.scale, rows, pass_.spans).items():
        out[name] = value if name == "argmax" else value.to(pass_.work)
    if pass_.topk:
        order = torch.argsort(positions)
        for start in range(0, len(rows), row_block):
            sel = order[start : start + row_block]
            pass_.block(rows[sel], positions[sel]).finish_topk(out, sel)


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
    row_block: int | None = None,
    tiles: Tiles | str = Tiles.AUTO,
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
        row_block: query rows handled together (default: 1024, or about the window for sliding layers).
        tiles: the tile kernel (:mod:`headprobe.stats.tiles`): ``eager``, ``compiled``, ``auto``
            (compiled when ``rows x k_len`` is at least ``COMPILE_THRESHOLD``), or ``triton`` (the whole
            pass in one fused kernel, :mod:`headprobe.stats.triton_stats`; top-k, when asked for, in a
            second pass of the tiles above).

    Returns:
        :class:`AttentionStats`; computed in float32 (float64 inputs stay float64).
    """
    rows, spans = _check(q, k, rows, spans)
    _, h, q_len, dim = q.shape
    k_len = k.shape[2]
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    fused = Tiles(tiles) is Tiles.TRITON
    if fused:
        why = unsupported_device(q.device, q.dtype)
        if why is not None:
            raise SettingError(f"tiles='triton' cannot run here: {why}; or use tiles='auto'")
    scale = dim**-0.5 if scale is None else scale
    pass_ = _Pass(
        q=q,
        k=k,
        mask=CausalMask(window),
        scale=scale,
        work=work,
        spans=spans,
        topk=int(topk),
        chunk=chunk or _default_chunk(h, min(len(rows), row_block or 1024), q.device),
        core=None if fused else tile_kernel(tiles, len(rows) * k_len),
    )
    out = pass_.outputs(len(rows))
    positions = rows + (k_len - q_len)
    if row_block is None:  # sliding windows: blocks of about half a window (measured best on CPU)
        row_block = 1024 if window is None else max(128, min(1024, window // 2))
    (_fused if fused else _streamed)(pass_, out, rows, positions, row_block)
    n_visible = torch.minimum(positions + 1, torch.full_like(positions, window)) if window else positions + 1
    norm = _normalised(out["entropy"], n_visible)
    return AttentionStats(positions=positions, norm_entropy=norm, visible=n_visible, **out)


def _check(
    q: Tensor, k: Tensor, rows: Tensor | None, spans: list[tuple[int, int]] | None
) -> tuple[Tensor, list[tuple[int, int]]]:
    """Validate the shapes, rows and spans of :func:`attention_stats`; returns rows as a long tensor."""
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
    device = q.device
    rows = torch.arange(q_len, device=device) if rows is None else torch.as_tensor(rows, device=device).long()
    if rows.dim() != 1 or (len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= q_len)):
        raise ValueError(f"rows must be a 1-D tensor of query indices in [0, {q_len})")
    spans = list(spans or [])
    for start, end in spans:
        if not 0 <= start < end <= k_len:
            raise ValueError(f"span ({start}, {end}) is not a non-empty range inside [0, {k_len})")
    return rows, spans


@dataclass
class _Pass:
    """The fixed settings of one streaming pass over ``k`` (see :func:`attention_stats`)."""

    q: Tensor
    k: Tensor
    mask: CausalMask
    scale: float
    work: torch.dtype
    spans: list[tuple[int, int]]
    topk: int
    chunk: int
    core: TileKernel | None  # None: the tiles keep only the top-k (:func:`attention_stats` with triton)

    def outputs(self, n: int) -> dict[str, Tensor]:
        """Empty per-row output tensors for ``n`` rows."""
        b, h = self.q.shape[:2]
        dev, work, topk = self.q.device, self.work, self.topk
        return {
            "lse": torch.empty(b, h, n, dtype=work, device=dev),
            "entropy": torch.empty(b, h, n, dtype=work, device=dev),
            "max_prob": torch.empty(b, h, n, dtype=work, device=dev),
            "argmax": torch.empty(b, h, n, dtype=torch.long, device=dev),
            "mean_distance": torch.empty(b, h, n, dtype=work, device=dev),
            "span_mass": torch.empty(b, h, n, len(self.spans), dtype=work, device=dev),
            "topk_idx": torch.full((b, h, n, topk), -1, dtype=torch.long, device=dev),
            "topk_prob": torch.zeros(b, h, n, topk, dtype=work, device=dev),
        }

    def block(self, rows: Tensor, pos: Tensor) -> _Running:
        """Stream every key tile some of ``rows`` (query indices, at key positions ``pos``) can see."""
        q, k, window = self.q, self.k, self.mask.window
        b, h, _, dim = q.shape
        hkv = k.shape[1]
        first, last = int(pos.min()), int(pos.max())
        lo, hi = self.mask.key_range(first)[0], last + 1
        r = len(rows)
        # queries of one kv head side by side, with the scale folded in: [b, hkv, groups * r, d]
        qs = (q[:, :, rows].to(self.work) * self.scale).reshape(b, hkv, (h // hkv) * r, dim)
        acc = _Running(b, h, r, len(self.spans), self.topk, self.work, q.device)
        for t0 in range(lo, hi, self.chunk):
            t1 = min(hi, t0 + self.chunk)
            kpos = torch.arange(t0, t1, device=q.device)
            # a tile every row of the block sees entirely needs no mask (most tiles of a causal pass)
            whole = t1 - 1 <= first and (window is None or t0 >= last - window + 1)
            visible = None if whole else self.mask.visible(pos[:, None], kpos[None, :])
            s = (qs @ k[:, :, t0:t1].to(self.work).transpose(-1, -2)).reshape(b, h, r, t1 - t0)
            acc.update(s, visible, kpos, pos, self.spans, self.core)
        return acc


def _normalised(entropy: Tensor, n_visible: Tensor) -> Tensor:
    """``entropy / log(n_visible)``, and 0 where a row sees a single key."""
    log_n = torch.log(n_visible.to(entropy.dtype))
    return torch.where(
        n_visible > 1,
        entropy / torch.where(n_visible > 1, log_n, torch.ones_like(log_n)),
        torch.zeros_like(entropy),
    )
