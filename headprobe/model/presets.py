"""The named presets: the study's head-dimension grids, plus a CPU-trainable toy grid of the same design.

Each grid is one model scale whose members differ only in how the full-attention budget
(``n_heads * width``) is split; the sliding-window layers keep one shape across a grid. That is our
reading of the study: the full-attention layers are where long-range retrieval has to happen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headprobe.model.config import AttentionConfig, ConfigError, ModelConfig

TOY_VOCAB_SIZE = 4096  # the toys' built-in BPE (tokenizer "toy": headprobe.text.toy_tokenizer)
LARGE_VOCAB_SIZE = 65_536  # a 64K BPE vocabulary (fits uint16 token shards); override to match yours


@dataclass(frozen=True)
class _Grid:
    """One model scale; members differ only in how the full-attention budget is split."""

    budget: int  # n_heads * width of the full-attention layers
    full_rope_dim: int
    base: dict[str, Any]
    swa: AttentionConfig


_GRIDS = {
    "toy": _Grid(
        budget=128,
        full_rope_dim=8,
        # 4 layers, sliding and full alternating (1:1, not the study's 3:1), the built-in 4,096-token BPE:
        # deeper or byte-level toys did not learn to retrieve on a CPU budget. A window of 8 tokens: with
        # 16-64 the sliding layer after the first full one learns the copy circuit first and the full
        # layers never take it over past the window (docs/training.md)
        base=dict(vocab_size=TOY_VOCAB_SIZE, d_model=128, n_layers=4, full_every=2, d_ff=384, max_seq_len=4096),
        swa=AttentionConfig(n_heads=4, qk_head_dim=32, v_head_dim=32, rope_dim=32, window=8),
    ),
    "0.6b": _Grid(
        budget=2048,
        full_rope_dim=64,
        base=dict(vocab_size=LARGE_VOCAB_SIZE, d_model=1024, n_layers=28, d_ff=3456, max_seq_len=4096),
        swa=AttentionConfig(n_heads=16, qk_head_dim=128, v_head_dim=128, rope_dim=128, window=512),
    ),
    "3b": _Grid(
        budget=2048,
        full_rope_dim=64,
        base=dict(vocab_size=LARGE_VOCAB_SIZE, d_model=2048, n_layers=36, d_ff=10240, max_seq_len=4096),
        swa=AttentionConfig(n_heads=16, qk_head_dim=128, v_head_dim=128, rope_dim=128, window=512),
    ),
}

# member suffix -> (qk width, v width); symmetric members are "d<width>"
_STUDY_MEMBERS = {
    "d128": (128, 128),
    "d256": (256, 256),
    "d512": (512, 512),
    "k512v128": (512, 128),
    "k128v512": (128, 512),
}
_MEMBERS = {
    "toy": {"d16": (16, 16), "d32": (32, 32), "d64": (64, 64), "k64v16": (64, 16), "k16v64": (16, 64)},
    "0.6b": _STUDY_MEMBERS,
    "3b": _STUDY_MEMBERS,
}


def _build_preset(scale: str, member: str) -> ModelConfig:
    grid = _GRIDS[scale]
    qk, v = _MEMBERS[scale][member]
    heads = grid.budget // max(qk, v)
    full = AttentionConfig(
        n_heads=heads, qk_head_dim=qk, v_head_dim=v, rope_dim=min(grid.full_rope_dim, qk), window=None
    )
    return ModelConfig(**grid.base, swa=grid.swa, full=full, name=f"{scale}-{member}")


def list_presets(scale: str | None = None) -> list[str]:
    """Preset names, optionally only those of one scale (``toy``, ``0.6b``, ``3b``)."""
    if scale is not None and scale not in _GRIDS:
        raise ConfigError(f"unknown scale {scale!r}; choose one of {sorted(_GRIDS)}")
    scales = [scale] if scale else list(_GRIDS)
    return [f"{s}-{m}" for s in scales for m in _MEMBERS[s]]


def list_scales() -> list[str]:
    return list(_GRIDS)


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset, e.g. ``preset("0.6b-k512v128")``; keyword overrides replace top-level fields
    (``preset("0.6b-d128", vocab_size=32_000)``)."""
    scale, _, member = name.partition("-")
    if scale not in _GRIDS or member not in _MEMBERS[scale]:
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(list_presets())}")
    cfg = _build_preset(scale, member)
    return cfg.replace(**overrides) if overrides else cfg
