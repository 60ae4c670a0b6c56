"""Rotary position embedding (RoPE), optionally on only the first ``rope_dim`` dims of a head.

For a head vector ``x`` of width ``D`` and ``r = rope_dim``, the first ``r`` dims are split into
halves ``a = x[:r/2]`` and ``b = x[r/2:r]`` (NeoX / Llama layout). Pair ``i`` is rotated by the
angle ``pos * theta^(-2i/r)``:

    a_i' = a_i cos(angle_i) - b_i sin(angle_i)
    b_i' = b_i cos(angle_i) + a_i sin(angle_i)

and dims ``r .. D-1`` pass through unchanged (partial RoPE). Dot products of rotated queries and
keys then depend on positions only through their difference.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Rotary(nn.Module):
    """Applies RoPE to ``x: [batch, seq, heads, dim]`` at absolute positions ``offset .. offset+seq-1``;
    ``offset`` is an int or a ``[batch]`` tensor (rows at different positions: batched decoding)."""

    def __init__(self, rope_dim: int, theta: float) -> None:
        super().__init__()
        self.rope_dim = rope_dim
        self.theta = theta
        self._cache: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def _cos_sin(self, length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos, sin: [length, rope_dim/2]`` for positions ``0 .. length-1``, grown on demand."""
        key = (device, dtype)
        cached = self._cache.get(key)
        if cached is None or cached[0].shape[0] < length:
            size = max(length, 2 * cached[0].shape[0] if cached is not None else 0)
            work = torch.float64  # angles in float64: large positions keep their precision
            half = self.rope_dim // 2
            inv_freq = self.theta ** (-torch.arange(half, dtype=work, device=device) * 2 / self.rope_dim)
            angles = torch.arange(size, dtype=work, device=device)[:, None] * inv_freq[None, :]
            cached = (angles.cos().to(dtype), angles.sin().to(dtype))
            self._cache[key] = cached
        return cached[0][:length], cached[1][:length]

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        if self.rope_dim == 0:
            return x
        seq = x.shape[1]
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        if isinstance(offset, Tensor):
            positions = offset.to(x.device)[:, None] + torch.arange(seq, device=x.device)  # [batch, seq]
            cos, sin = self._cos_sin(int(positions.max()) + 1, x.device, work)
            cos, sin = cos[positions][:, :, None, :], sin[positions][:, :, None, :]  # [batch, seq, 1, half]
        else:
            cos, sin = self._cos_sin(offset + seq, x.device, work)
            cos, sin = cos[offset:, None, :], sin[offset:, None, :]  # [seq, 1, half]
        half = self.rope_dim // 2
        a = x[..., :half].to(work)
        b = x[..., half : self.rope_dim].to(work)
        rotated = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)
        return torch.cat([rotated, x[..., self.rope_dim :]], dim=-1)
