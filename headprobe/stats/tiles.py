"""Tile kernels of the streaming statistics: one online-softmax step over a tile of scores.

Every kernel computes the same function (:func:`tile_update`); the engine
(:mod:`headprobe.stats.engine`) picks one by name:

=========  ==========================================================================================
eager      plain PyTorch ops, one temporary per op; fastest for short inputs (no compile time)
compiled   the same code fused by ``torch.compile`` (dynamic shapes): 5-6x faster tiles on CPU, costs
           seconds to compile once per process; the default once ``rows x keys >= COMPILE_THRESHOLD``
triton     not a tile function: the whole pass over every key tile fused in one Triton kernel
           (:mod:`headprobe.stats.triton_stats`; CUDA, or CPU float32 under Triton's interpreter), the
           engine running the tiles only for top-k
=========  ==========================================================================================

A new tile function is a new entry of :data:`TILE_KERNELS` with the same signature; the tests hold every
entry, and the fused kernel, to a dense float64 reference.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from headprobe.core.choice import Choice

COMPILE_THRESHOLD = 1 << 22  # rows x keys (e.g. 2K x 2K)
NEG = -1e30  # stands in for -inf on masked scores: exp underflows to 0 and products stay finite


def tile_update(
    s: Tensor,
    visible: Tensor | None,
    m: Tensor,
    l: Tensor,
    a: Tensor,
    d: Tensor,
    kpos: Tensor,
    pos: Tensor,
    indicator: Tensor | None,
) -> tuple[Tensor, ...]:
    """One online-softmax step over a tile: scores ``s [b, h, r, c]``, running ``m, l, a, d [b, h, r]``.

    Returns the new ``m, l, a, d``, the tile's max and first argmax (tile-relative), and the tile's
    unnormalised mass on each span (``indicator [c, n_spans]``), all in the new max's frame.
    Pure tensor code, so ``torch.compile`` can fuse it into a single pass over the tile.
    """
    if visible is not None:
        s = s.masked_fill(~visible, NEG)
    tile_max, tile_arg = s.max(dim=-1)  # first occurrence on ties
    new_m = torch.maximum(m, tile_max)
    rel = s - new_m[..., None]
    e = torch.exp(rel)
    if visible is not None:  # rows with nothing visible yet have new_m = NEG, where exp(rel) = 1
        e = e.masked_fill(~visible, 0.0)
    alpha = torch.exp(m - new_m)
    tile_l = e.sum(-1)
    a = alpha * (a + (m - new_m) * l) + (e * rel).sum(-1)
    l = alpha * l + tile_l
    d = alpha * d + pos * tile_l - (e * kpos).sum(-1)
    span_part = e @ indicator if indicator is not None else None
    return new_m, l, a, d, tile_max, tile_arg, span_part


TileKernel = Callable[..., tuple[Tensor, ...]]


class Tiles(Choice, what="tile kernel"):
    """Names of the tile kernels; ``AUTO`` picks by the size of the pass."""

    AUTO = "auto"
    EAGER = "eager"
    COMPILED = "compiled"
    TRITON = "triton"  # the fused whole-pass kernel; handled by the engine, not a tile function


@functools.lru_cache(maxsize=1)
def _compiled() -> TileKernel:
    return torch.compile(tile_update, dynamic=True)


TILE_KERNELS: dict[Tiles, Callable[[], TileKernel]] = {
    Tiles.EAGER: lambda: tile_update,
    Tiles.COMPILED: _compiled,
}


def tile_kernel(name: Tiles | str, work: int) -> TileKernel:
    """The kernel called ``name``; ``auto`` compiles when ``work`` (rows x keys) reaches ``COMPILE_THRESHOLD``
    (compiling costs seconds once; it pays off on long inputs)."""
    name = Tiles(name)
    if name is Tiles.TRITON:
        raise ValueError("tiles='triton' is a fused whole pass, not a tile function: call attention_stats")
    if name is Tiles.AUTO:
        name = Tiles.COMPILED if work >= COMPILE_THRESHOLD else Tiles.EAGER
    return TILE_KERNELS[name]()
