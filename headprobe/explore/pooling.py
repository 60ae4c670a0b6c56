"""Exact pooled attention maps: the mass of a query block on a key block, tile by tile, never ``L x L``.

For one head with post-RoPE queries ``q_i`` and keys ``k_j``, ``p_ij = exp(scale <q_i, k_j> - lse_i)`` on
the visible keys (:mod:`headprobe.model.masks`) and 0 elsewhere. A map at *block* ``b`` (tokens per
pixel side) has one pixel per query block ``I`` x key block ``J``:

    pixel(I, J) = mean_{i in I} sum_{j in J} p_ij

the exact attention mass a query of the block puts on the key block, on average. At ``b = 1`` a pixel is
one probability and every row of a full-width map sums to 1. Blocks cut by the end of the input (or of
the requested range) average over the rows that exist.

Maps are cut into square tiles of :data:`TILE` pixels (a zoom pyramid, :class:`TileSpec`): level ``n``
has ``b = 2**n``. A tile needs its rows' log-sum-exp: when it is not known yet, the pass computes each
row's scores over *all* its visible keys anyway, so it returns the rows' lse as a by-product and the
caller pools a whole band of tiles from that one pass (:func:`pooled_mass` with ``keys`` spanning the band).
Work is ``O(rows x visible keys x qk_dim)``; memory is one score chunk of about ``budget`` elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from headprobe.model.masks import CausalMask

TILE = 256  # pixels per tile side
SCORE_BUDGET = 1 << 22  # score elements per chunk (16 MiB in float32)


@dataclass(frozen=True)
class TileSpec:
    """One square tile of a head's attention map.

    Attributes:
        level: zoom level; a pixel covers ``2**level`` query x ``2**level`` key positions (0 = tokens).
        row: tile row: queries ``row * span .. (row + 1) * span - 1``.
        col: tile column: keys ``col * span .. (col + 1) * span - 1``.
    """

    level: int
    row: int
    col: int

    @property
    def block(self) -> int:
        """Tokens per pixel side."""
        return 1 << self.level

    @property
    def span(self) -> int:
        """Tokens per tile side."""
        return TILE << self.level

    def queries(self, length: int) -> tuple[int, int]:
        """Half-open query range the tile covers in a ``length``-token input."""
        start = self.row * self.span
        return start, min(length, start + self.span)

    def keys(self, length: int) -> tuple[int, int]:
        """Half-open key range the tile covers in a ``length``-token input."""
        start = self.col * self.span
        return start, min(length, start + self.span)

    def empty(self, length: int, window: int | None) -> bool:
        """True when no query of the tile sees any of its keys (above the diagonal, outside the
        sliding band, or past the input), so the tile is all zeros."""
        (q0, q1), (k0, k1) = self.queries(length), self.keys(length)
        if q0 >= q1 or k0 >= k1 or k0 > q1 - 1:
            return True
        return window is not None and k1 - 1 < q0 - window + 1


def tiles_across(length: int, level: int) -> int:
    """Tiles per side of a ``length``-token map at ``level``."""
    return -(-length // (TILE << level))


def top_level(length: int) -> int:
    """The coarsest useful level: one tile covers the whole ``length``-token map."""
    return max(0, math.ceil(math.log2(max(1, length) / TILE)))


def _probabilities(
    s: Tensor, mask: CausalMask, rows: tuple[int, int], keys: tuple[int, int], lse: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Scores ``s [rows, keys]`` (rows ``c0 .. c1-1`` on keys ``lo .. hi-1``), masked and exponentiated in
    place. Returns ``(e, lse, norm)``: with ``lse`` given, ``e`` are the probabilities and ``norm`` is
    ``None``; else ``lse`` is computed from these scores (they must hold every key the rows see) and
    ``e * norm[:, None]`` are the probabilities."""
    (c0, c1), (lo, hi) = rows, keys
    pos = torch.arange(c0, c1, device=s.device)
    # only the keys some rows of the chunk do not see need the mask: the diagonal end and the window's start
    inner_lo = lo if mask.window is None else max(lo, c1 - mask.window)
    for a, b in ((lo, min(hi, inner_lo)), (max(lo, c0), hi)):
        if a < b:
            kpos = torch.arange(a, b, device=s.device)
            s[:, a - lo : b - lo].masked_fill_(~mask.visible(pos[:, None], kpos[None, :]), -math.inf)
    if lse is None:
        m = s.amax(-1, keepdim=True)
        e = s.sub_(m).exp_()
        row_lse = m[:, 0] + torch.log(e.sum(-1))
        return e, row_lse, torch.exp(m[:, 0] - row_lse)
    row_lse = lse.to(s.dtype)
    return s.sub_(row_lse[:, None]).exp_(), row_lse, None


def pooled_mass(
    q: Tensor,
    k: Tensor,
    *,
    window: int | None,
    scale: float,
    rows: tuple[int, int],
    keys: tuple[int, int],
    block: int,
    lse: Tensor | None = None,
    budget: int = SCORE_BUDGET,
) -> tuple[Tensor, Tensor]:
    """Pooled attention mass of query rows ``rows`` on keys ``keys`` at ``block`` tokens per pixel.

    Args:
        q: ``[length, qk_dim]`` one head's post-RoPE queries at positions ``0 .. length-1``.
        k: ``[length, qk_dim]`` the post-RoPE keys its query head reads (its kv head under GQA).
        window: keys visible per query including its own; ``None`` = full causal.
        scale: softmax scale of ``q . k``.
        rows, keys: half-open position ranges; the map's pixel grid starts at ``rows[0]`` and ``keys[0]``.
        block: tokens per pixel side.
        lse: ``[rows[1] - rows[0]]`` the rows' log-sum-exp when known; else computed here over every key
            each row sees (then the pass also covers keys outside ``keys``).
        budget: score elements per chunk of rows.

    Returns:
        ``(values, lse)``: ``values [ceil(n_rows / block), ceil(n_keys / block)]`` the pooled masses
        (float32, float64 for float64 inputs) and ``lse [n_rows]`` of the rows.
    """
    (r0, r1), (k0, k1) = rows, keys
    length = q.shape[0]
    if not (0 <= r0 < r1 <= length and 0 <= k0 < k1 <= length) or block < 1:
        raise ValueError(f"rows {rows} and keys {keys} must be non-empty ranges in [0, {length}], block >= 1")
    if lse is not None and lse.shape != (r1 - r0,):
        raise ValueError(f"lse has shape {tuple(lse.shape)}; expected ({r1 - r0},) for rows {rows}")
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    mask = CausalMask(window)
    n_rows, n_cols = -(-(r1 - r0) // block), -(-(k1 - k0) // block)
    out = torch.zeros(n_rows, n_cols, dtype=work, device=q.device)
    lse_out = torch.empty(r1 - r0, dtype=work, device=q.device)
    if window is not None:  # a chunk of ``step`` rows sees at most ``step + window - 1`` keys
        step = int((math.sqrt(window * window + 4 * budget) - window) / 2)
    else:  # at most every key up to the chunk's end (or the requested ones)
        step = budget // max(1, r1 if lse is None else k1 - k0)
    step = max(1, min(r1 - r0, step))
    for c0 in range(r0, r1, step):
        c1 = min(r1, c0 + step)
        lo = mask.key_range(c0)[0]
        hi = c1
        if lse is not None:
            lo, hi = max(lo, k0), min(hi, k1)
            if lo >= hi:
                lse_out[c0 - r0 : c1 - r0] = lse[c0 - r0 : c1 - r0].to(work)
                continue
        s = (q[c0:c1].to(work) * scale) @ k[lo:hi].to(work).T  # [c, hi - lo]
        e, row_lse, norm = _probabilities(s, mask, (c0, c1), (lo, hi), None if lse is None else lse[c0 - r0 : c1 - r0])
        lse_out[c0 - r0 : c1 - r0] = row_lse
        a, b = max(lo, k0), min(hi, k1)
        if a >= b:
            continue
        pos = torch.arange(c0, c1, device=q.device)
        part = e[:, a - lo : b - lo]
        first = (a - k0) // block
        left = (a - k0) - first * block
        cols = -(-(left + b - a) // block)
        pooled = F.pad(part, (left, cols * block - left - (b - a))).view(c1 - c0, cols, block).sum(-1)
        if norm is not None:
            pooled = pooled * norm[:, None]
        out[:, first : first + cols].index_add_(0, (pos - r0) // block, pooled)
    counts = torch.clamp((r1 - r0) - torch.arange(n_rows, device=q.device) * block, max=block)
    return out / counts[:, None].to(work), lse_out
