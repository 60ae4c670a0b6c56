"""The attention seam: the one contract every attention call passes through.

Every attention layer, ours (:class:`headprobe.model.transformer.Attention`) and a Hugging Face
model's (through headprobe's ``AttentionInterface`` function, :mod:`headprobe.hooked.hf`), describes
its call as an :class:`AttentionCall` and hands it, with its values, to the model's :class:`Seam`.
The seam shows the call to every attached hook (streaming statistics, the explorer), then computes
the output with the seam's attention backend (:func:`headprobe.model.attention.attention`; a new
kernel is a new backend). So hooks see exactly the queries and keys the output is computed from,
and no dense ``L x L`` attention pattern is ever built for them. Interventions (:meth:`Seam.intervene`,
e.g. head ablation, :mod:`headprobe.hooked.ablation`) change each head's output before the layer's
output projection, for our models and Hugging Face models alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from torch import Tensor

from headprobe.core.errors import HeadprobeError
from headprobe.model.attention import attention
from headprobe.model.config import Backend, LayerType
from headprobe.model.masks import CausalMask, KeyPadding


class SeamError(HeadprobeError, ValueError):
    """Hooks attached to a call they cannot see correctly (e.g. a left-padded batch)."""


@dataclass(frozen=True)
class AttentionCall:
    """What one attention layer sees in one forward pass; handed to every attached hook.

    Attributes:
        layer: block index.
        layer_type: sliding-window or full attention.
        q: post-RoPE queries ``[batch, heads, q_len, qk_dim]``.
        k: post-RoPE keys ``[batch, kv_heads, k_len, qk_dim]`` (cached keys first when decoding).
        window: keys visible per query including its own; ``None`` = full causal.
        scale: softmax scale applied to ``q . k``.
        key_start: absolute position of ``k[:, :, 0]``; query ``i`` sits at absolute position
            ``key_start + k_len - q_len + i`` (the bottom-right convention of :mod:`headprobe.model.masks`).
        padding: left padding of a batched decode step (rows of different lengths); ``None`` otherwise.
        v: the values ``[batch, kv_heads, k_len, v_dim]`` (cached values first), as hooks see the call (the
            seam adds them; ``None`` on a call not yet handed to the seam).
    """

    layer: int
    layer_type: LayerType
    q: Tensor
    k: Tensor
    window: int | None
    scale: float
    key_start: int
    padding: KeyPadding | None = None
    v: Tensor | None = None

    @property
    def mask(self) -> CausalMask:
        return CausalMask(self.window)

    @property
    def query_start(self) -> int:
        """Absolute position of the first query."""
        return self.key_start + self.k.shape[2] - self.q.shape[2]


AttentionHook = Callable[[AttentionCall], None]
Intervention = Callable[[AttentionCall, Tensor], Tensor]  # (call, per-head output [batch, heads, q_len, v_dim]) -> same


class Seam:
    """Where a model's attention calls pass: attached hooks see each call, then the backend computes it.

    Attributes:
        backend: the attention backend for unpadded calls (``Backend.AUTO`` picks per call); left-padded
            decode steps always run the reference path (see :func:`headprobe.model.attention.attention`).
    """

    def __init__(self, backend: Backend = Backend.AUTO) -> None:
        self.backend = Backend(backend)
        self._hooks: list[AttentionHook] = []
        self._interventions: list[Intervention] = []

    @property
    def hooked(self) -> bool:
        return bool(self._hooks)

    @contextmanager
    def attach(self, hook: AttentionHook) -> Iterator[None]:
        """Call ``hook(call)`` for every attention call while the context is open; always removed."""
        self._hooks.append(hook)
        try:
            yield
        finally:
            self._hooks.remove(hook)

    @contextmanager
    def intervene(self, fn: Intervention) -> Iterator[None]:
        """Replace every call's per-head output ``[batch, heads, q_len, v_dim]`` (before the output
        projection) by ``fn(call, output)`` while the context is open; always removed. Hooks still see
        the call's queries and keys as computed (an intervention acts on what a head writes)."""
        self._interventions.append(fn)
        try:
            yield
        finally:
            self._interventions.remove(fn)

    def __call__(self, call: AttentionCall, v: Tensor) -> Tensor:
        """Show ``call`` to the hooks, then attend: ``v: [batch, kv_heads, k_len, v_dim]`` ->
        ``[batch, heads, q_len, v_dim]``, changed by the open interventions (:meth:`intervene`)."""
        if self._hooks:
            if call.padding is not None:
                raise SeamError("hooks see one unpadded sequence: decode hooked samples one at a time")
            seen = replace(call, v=v)
            for hook in list(self._hooks):
                hook(seen)
        out = attention(
            call.q,
            call.k,
            v,
            window=call.window,
            scale=call.scale,
            backend=self.backend if call.padding is None else Backend.AUTO,
            padding=call.padding,
        )
        for fn in list(self._interventions):
            out = fn(call, out)
        return out
