"""Model configuration: plain dataclasses, their validation, JSON round-trip, and the named presets.

A model is a stack of ``n_layers`` pre-norm blocks. Layers ``full_every-1, 2*full_every-1, ...``
(3, 7, 11, ... for the default ``full_every=4``) use full causal attention with the ``full`` shape;
every other layer uses sliding-window attention with the ``swa`` shape. This is the study's 3:1
interleaving.

The head-dimension grids (``toy-*``, ``0.6b-*``, ``3b-*``) vary only the full-attention layers: the
sliding-window layers keep one shape across a grid. That is our reading of the study, which splits
one attention budget (``n_heads * width``) differently in each member; the full-attention layers
are where long-range retrieval has to happen, the sliding-window layers cannot see past their window.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.tokenizer import ByteTokenizer

LayerType = Literal["sliding", "full"]


class ConfigError(ValueError):
    """A configuration value is out of range or inconsistent; the message names the field and the fix."""


@dataclass(frozen=True)
class AttentionConfig:
    """Shape of the attention in one layer type.

    Attributes:
        n_heads: number of query heads.
        qk_head_dim: width of each query/key head (the dot-product dimension).
        v_head_dim: width of each value head; the o projection reads ``n_heads * v_head_dim``.
        n_kv_heads: number of key/value heads (grouped-query attention); ``None`` means ``n_heads``.
            Query head ``h`` reads key/value head ``h // (n_heads // n_kv_heads)``.
        rope_dim: how many of the ``qk_head_dim`` dims are rotated by RoPE (the first ``rope_dim``,
            rotated as two halves, NeoX style); 0 = no positional rotation.
        rope_theta: RoPE base.
        window: number of keys a query sees *including its own position* (query ``i`` sees keys
            ``i-window+1 .. i``); ``None`` = full causal attention.
    """

    n_heads: int
    qk_head_dim: int
    v_head_dim: int
    n_kv_heads: int | None = None
    rope_dim: int = 0
    rope_theta: float = 10_000.0
    window: int | None = None

    @property
    def kv_heads(self) -> int:
        """The effective number of key/value heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def scale(self) -> float:
        """Softmax scale: ``1 / sqrt(qk_head_dim)``."""
        return self.qk_head_dim**-0.5

    def validate(self, where: str = "attention") -> None:
        """Raise :class:`ConfigError` naming the bad field and the fix."""
        for name in ("n_heads", "qk_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}.{name} must be a positive integer, got {value!r}")
        if self.n_kv_heads is not None and (not isinstance(self.n_kv_heads, int) or self.n_kv_heads < 1):
            raise ConfigError(f"{where}.n_kv_heads must be a positive integer or null, got {self.n_kv_heads!r}")
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"{where}.n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}: "
                "each key/value head must serve the same number of query heads; pick n_kv_heads "
                f"among the divisors of {self.n_heads}"
            )
        if self.rope_dim < 0 or self.rope_dim % 2:
            raise ConfigError(
                f"{where}.rope_dim={self.rope_dim} must be a non-negative even number "
                "(RoPE rotates pairs of dimensions)"
            )
        if self.rope_dim > self.qk_head_dim:
            raise ConfigError(
                f"{where}.rope_dim={self.rope_dim} exceeds qk_head_dim={self.qk_head_dim}: "
                "at most every query/key dimension can be rotated"
            )
        if self.rope_dim and self.rope_theta <= 0:
            raise ConfigError(f"{where}.rope_theta must be positive, got {self.rope_theta}")
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ConfigError(
                f"{where}.window={self.window!r} must be an integer >= 1 (keys seen including the "
                "query's own) or null for full causal attention"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes a model's shape. Serialises to ``config.json``.

    Attributes:
        vocab_size: number of token ids.
        d_model: residual-stream width.
        n_layers: number of blocks.
        d_ff: hidden width of the SwiGLU MLP.
        swa: attention shape of the sliding-window layers (``window`` must be set).
        full: attention shape of the full-attention layers (``window`` must be ``None``).
        full_every: every ``full_every``-th layer (1-based) is full attention; 1 = all full.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the token embedding with the LM head.
        max_seq_len: the context length the model is meant to be trained at (planner and trainer
            default); the forward pass itself accepts longer inputs.
        init_std: standard deviation of the normal weight init (output projections are scaled by
            ``1/sqrt(2*n_layers)``).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    d_ff: int
    swa: AttentionConfig
    full: AttentionConfig
    full_every: int = 4
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    max_seq_len: int = 4096
    init_std: float = 0.02
    name: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        self.validate()

    # -- structure -------------------------------------------------------------------------
    def layer_type(self, layer: int) -> LayerType:
        """``"full"`` for layers ``full_every-1, 2*full_every-1, ...``, else ``"sliding"``."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range for n_layers={self.n_layers}")
        return "full" if (layer + 1) % self.full_every == 0 else "sliding"

    def layer_types(self) -> list[LayerType]:
        return [self.layer_type(i) for i in range(self.n_layers)]

    def attention(self, layer: int) -> AttentionConfig:
        """The attention shape of ``layer``."""
        return self.full if self.layer_type(layer) == "full" else self.swa

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "d_ff", "full_every", "max_seq_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.swa, AttentionConfig) or not isinstance(self.full, AttentionConfig):
            raise ConfigError("swa and full must be AttentionConfig values")
        self.swa.validate("swa")
        self.full.validate("full")
        if self.full_every > 1 and self.swa.window is None:
            raise ConfigError(
                "swa.window is null but the model has sliding-window layers: set swa.window "
                "(e.g. 512) or full_every=1 for an all-full-attention model"
            )
        if self.full.window is not None:
            raise ConfigError(
                f"full.window={self.full.window}: full-attention layers see every earlier key; "
                "set full.window to null (sliding windows belong in swa)"
            )
        if self.norm_eps <= 0 or self.init_std <= 0:
            raise ConfigError("norm_eps and init_std must be positive")

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config fields {unknown}; known fields are {sorted(known)}")
        att_fields = {f.name for f in dataclasses.fields(AttentionConfig)}
        for key in ("swa", "full"):
            if key not in data:
                raise ConfigError(f"config is missing the '{key}' attention block")
            sub = data[key]
            if isinstance(sub, dict):
                bad = sorted(set(sub) - att_fields)
                if bad:
                    raise ConfigError(f"unknown fields {bad} in '{key}'; known fields are {sorted(att_fields)}")
                data[key] = AttentionConfig(**sub)
        try:
            return cls(**data)
        except TypeError as err:  # missing required fields
            raise ConfigError(f"incomplete config: {err}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """Read a ``config.json`` (or a checkpoint folder containing one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"model config {path} does not exist")
        try:
            return cls.from_json(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------
# Presets: the study's head-dimension grids, plus a CPU-trainable toy grid of the same design.
# ---------------------------------------------------------------------------------------------

BYTE_VOCAB_SIZE = ByteTokenizer.vocab_size  # 256 bytes + 8 special ids
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
        base=dict(vocab_size=BYTE_VOCAB_SIZE, d_model=128, n_layers=8, d_ff=384, max_seq_len=4096),
        swa=AttentionConfig(n_heads=4, qk_head_dim=32, v_head_dim=32, rope_dim=32, window=64),
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
