"""Key/value cache for incremental decoding.

Per layer it stores post-RoPE keys ``[batch, kv_heads, T, qk_dim]`` and values
``[batch, kv_heads, T, v_dim]``. Full-attention layers keep every key (in a buffer that doubles when
full, so a decode step copies nothing). Sliding-window layers keep only the last ``window - 1`` keys:
that is all the next query can see besides its own key (see :mod:`trainer.masks`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.config import ModelConfig


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
            ``n_new`` of them, which is the bottom-right convention of :mod:`trainer.masks`.
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
            capacity = max(needed, 2 * (0 if self.k is None else self.k.shape[2]), 16)
            self.k = self._grow(self.k, k_new, capacity)
            self.v = self._grow(self.v, v_new, capacity)
        self.k[:, :, self.length : needed] = k_new
        self.v[:, :, self.length : needed] = v_new
        self.length = needed
        return self.k[:, :, :needed], self.v[:, :, :needed]

    def _grow(self, old: Tensor | None, like: Tensor, capacity: int) -> Tensor:
        buf = like.new_empty(like.shape[0], like.shape[1], capacity, like.shape[3])
        if old is not None:
            buf[:, :, : self.length] = old[:, :, : self.length]
        return buf


class KVCache:
    """Caches of all layers plus the number of tokens already processed (the next token's position)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.layers = [LayerCache(cfg.attention(i).window) for i in range(cfg.n_layers)]
        self.position = 0

    def __getitem__(self, layer: int) -> LayerCache:
        return self.layers[layer]
