"""The one definition of which keys a query may see.

Convention (used by every attention backend, the KV cache and the analysis hooks):

* Attention is always causal. A call has ``q_len`` queries and ``k_len >= q_len`` keys; the queries
  are the *last* ``q_len`` positions of the keys, so query ``i`` (0-based within the call) sits at
  key position ``k_len - q_len + i``. This is bottom-right alignment, as in FlashAttention; a decode
  step is ``q_len = 1`` against the whole cache.
* A sliding window of ``W`` means query position ``p`` sees keys ``p-W+1 .. p``: exactly ``W`` keys
  including its own (fewer near the start). In FlashAttention terms this is
  ``window_size=(W-1, 0)``; in Hugging Face terms ``sliding_window=W``.
* ``window=None`` is full causal attention: keys ``0 .. p``.
* A batch of sequences of different lengths is *left*-padded (:class:`KeyPadding`): each row is
  right-aligned on the key axis, so the convention above holds per row in key-index terms, and a
  row's padding keys are never visible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CausalMask:
    """Causal visibility, optionally limited to a sliding window.

    Attributes:
        window: number of visible keys including the query's own position; ``None`` = unlimited.
    """

    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ValueError(f"window must be an integer >= 1 or None, got {self.window!r}")

    def visible(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Elementwise: may the query at absolute position ``q_pos`` see the key at ``k_pos``?

        Broadcasts like any elementwise op; also serves as a FlexAttention ``mask_mod`` body.
        """
        seen = k_pos <= q_pos
        if self.window is not None:
            seen = seen & (q_pos - k_pos < self.window)
        return seen

    def dense(self, q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
        """Boolean mask ``[q_len, k_len]`` (``True`` = visible) under the bottom-right convention.

        Materialises ``q_len * k_len`` booleans: for references and small blocks only.
        """
        if q_len > k_len:
            raise ValueError(f"q_len={q_len} exceeds k_len={k_len}: queries must be the last keys")
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        k_pos = torch.arange(k_len, device=device)[None, :]
        return self.visible(q_pos, k_pos)

    def key_range(self, q_pos: int) -> tuple[int, int]:
        """Half-open range ``[lo, hi)`` of key positions visible from query position ``q_pos``."""
        lo = 0 if self.window is None else max(0, q_pos - self.window + 1)
        return lo, q_pos + 1

    def covers(self, k_len: int) -> bool:
        """True when the window never cuts anything off for ``k_len`` keys (plain causal)."""
        return self.window is None or self.window >= k_len

    def flash_window_size(self) -> tuple[int, int]:
        """The equivalent FlashAttention ``window_size=(left, right)`` (with ``causal=True``)."""
        return (-1, -1) if self.window is None else (self.window - 1, 0)


@dataclass(frozen=True, eq=False)
class KeyPadding:
    """Left padding of a batch whose rows hold sequences of different lengths (batched decoding).

    Attributes:
        start: ``[batch]`` integer tensor; row ``b``'s keys ``0 .. start[b]-1`` on this call's key
            axis are padding and invisible to every query of that row. Its real keys are right-aligned,
            so causality and windows apply per row exactly as without padding. Padding keys and values
            may hold anything finite (:meth:`headprobe.model.kv_cache.KVCache.stack` writes zeros).
    """

    start: Tensor

    @classmethod
    def of_call(cls, pad: Tensor, first_key: int) -> KeyPadding:
        """The padding of a call whose first key sits at index ``first_key`` of the full (padded) key
        sequence, when row ``b``'s first ``pad[b]`` entries of that sequence are padding (a cache
        that keeps only recent keys, like a sliding window's, may have dropped some or all of them)."""
        return cls((pad - first_key).clamp(min=0))

    def valid(self, k_len: int) -> Tensor:
        """``[batch, k_len]`` bool: which keys of each row are real."""
        return torch.arange(k_len, device=self.start.device)[None, :] >= self.start[:, None]
