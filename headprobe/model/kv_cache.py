"""Key/value cache for incremental decoding.

Per layer it stores post-RoPE keys ``[batch, kv_heads, T, qk_dim]`` and values
``[batch, kv_heads, T, v_dim]``. Full-attention layers keep every key (in a buffer with 1/8 spare room
that grows by 1/8 when full, so a decode step rarely copies). Sliding-window layers keep only the
last ``window - 1`` keys: that is all the next query can see besides its own key (see
:mod:`headprobe.model.masks`).

Batched decoding of prompts of different lengths: prefill each prompt into its own cache, then
``KVCache.stack(caches)`` left-pads them into one cache (``pad[b]`` leading entries of row ``b`` are
padding, zero-filled); row ``b``'s next token sits at position ``position - pad[b]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headprobe.model.config import ModelConfig


def left_pad(rows: list[Tensor | None]) -> Tensor | None:
    """Concatenate caches of different lengths along the batch, right-aligned with zeros on the left.

    Args:
        rows: ``[b_i, heads, n_i, dim]`` each, or ``None`` for one row that has cached nothing yet.

    Returns:
        ``[sum b_i, heads, max n_i, dim]`` (``None`` when every entry is ``None``).
    """
    like = next((r for r in rows if r is not None), None)
    if like is None:
        return None
    length = max(r.shape[2] for r in rows if r is not None)
    out = []
    for r in rows:
        buf = like.new_zeros(1 if r is None else r.shape[0], like.shape[1], length, like.shape[3])
        if r is not None and r.shape[2]:
            buf[:, :, length - r.shape[2] :] = r
        out.append(buf)
    return torch.cat(out)


class LayerCache:
    """The cache of one attention layer."""

    def __init__(self, window: int | None) -> None:
        self.window = window
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = 0  # valid entries in k/v along dim 2

    def update(self, k_new: Tensor, v_new: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new keys/values and return all keys/values the new queries may attend to.

        Args:
            k_new: ``[batch, kv_heads, n_new, qk_dim]``.
            v_new: ``[batch, kv_heads, n_new, v_dim]``.

        Returns:
            ``(k, v)`` covering the cached keys followed by the new ones; the new queries are the last
            ``n_new`` of them, which is the bottom-right convention of :mod:`headprobe.model.masks`.
        """
        if self.window is not None:
            k = k_new if self.k is None else torch.cat([self.k[:, :, : self.length], k_new], dim=2)
            v = v_new if self.v is None else torch.cat([self.v[:, :, : self.length], v_new], dim=2)
            keep = min(self.window - 1, k.shape[2])
            self.k = k[:, :, k.shape[2] - keep :].clone()
            self.v = v[:, :, v.shape[2] - keep :].clone()
            self.length = keep
            return k, v
        n_new = k_new.shape[2]
        needed = self.length + n_new
        if self.k is None or self.k.shape[2] < needed:
            # room for 1/8 more (at least 256 entries): geometric growth keeps appends amortised O(1),
            # and a long prefill is not followed by a doubling of its cache at the first decode step
            capacity = needed + max(256, needed // 8)
            self.k = self._grow(self.k, k_new, capacity)
            self.v = self._grow(self.v, v_new, capacity)
        self.k[:, :, self.length : needed] = k_new
        self.v[:, :, self.length : needed] = v_new
        self.length = needed
        return self.k[:, :, :needed], self.v[:, :, :needed]

    @classmethod
    def stack(cls, layers: list[LayerCache]) -> LayerCache:
        """The rows of ``layers`` (caches of sequences of different lengths) right-aligned in one cache."""
        merged = cls(layers[0].window)
        k = left_pad([None if c.k is None else c.k[:, :, : c.length] for c in layers])
        v = left_pad([None if c.v is None else c.v[:, :, : c.length] for c in layers])
        if k is not None and v is not None:
            merged.k, merged.v, merged.length = k, v, k.shape[2]
        return merged

    def _grow(self, old: Tensor | None, like: Tensor, capacity: int) -> Tensor:
        buf = like.new_empty(like.shape[0], like.shape[1], capacity, like.shape[3])
        if old is not None:
            buf[:, :, : self.length] = old[:, :, : self.length]
        return buf


class KVCache:
    """Caches of all layers plus the number of tokens already processed (the next token's position).

    Attributes:
        position: entries appended along the key axis so far (the next token's position when unpadded).
        pad: ``[batch]`` leading padding entries per row (``None`` = no padding); see :meth:`stack`.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.layers = [LayerCache(cfg.attention(i).window) for i in range(cfg.n_layers)]
        self.position = 0
        self.pad: Tensor | None = None

    @classmethod
    def stack(cls, caches: list[KVCache]) -> KVCache:
        """One left-padded cache from unpadded caches of (possibly) different lengths, row order kept.

        Each input may hold several rows of one length; the result's ``pad[b]`` is
        ``max(position) - position`` of row ``b``'s source, and every row then continues together.
        """
        if not caches:
            raise ValueError("KVCache.stack needs at least one cache")
        if any(c.pad is not None for c in caches):
            raise ValueError("KVCache.stack takes unpadded caches (each prefilled on its own)")
        merged = cls(caches[0].cfg)
        total = max(c.position for c in caches)
        merged.position = total
        merged.layers = [LayerCache.stack([c.layers[i] for c in caches]) for i in range(len(merged.layers))]
        rows = [c.layers[0].k.shape[0] if c.layers[0].k is not None else 1 for c in caches]
        device = next((layer.k.device for layer in merged.layers if layer.k is not None), None)
        merged.pad = torch.tensor(
            [total - c.position for c, n in zip(caches, rows, strict=True) for _ in range(n)],
            dtype=torch.long,
            device=device,
        )
        return merged

    def __getitem__(self, layer: int) -> LayerCache:
        return self.layers[layer]
