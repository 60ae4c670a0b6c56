"""Model configuration: plain dataclasses, their validation and JSON round-trip.

A model is a stack of ``n_layers`` pre-norm blocks. Layers ``full_every-1, 2*full_every-1, ...``
(3, 7, 11, ... for the default ``full_every=4``) use full causal attention with the ``full`` shape;
every other layer uses sliding-window attention with the ``swa`` shape. This is the study's 3:1
interleaving.

The named grids live in :mod:`headprobe.model.presets`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import is_gguf, not_a


class LayerType(Choice, what="layer type"):
    """The two kinds of attention layer; tables store ``.value``."""

    SLIDING = "sliding"  # sees a window of recent keys (AttentionConfig.window)
    FULL = "full"  # sees every earlier key


class Backend(Choice, what="attention backend"):
    """The attention backends of :mod:`headprobe.model.attention`; ``AUTO`` picks the fastest that can run a
    call."""

    AUTO = "auto"
    REFERENCE = "reference"
    SDPA = "sdpa"
    FLEX = "flex"
    FLASH = "flash"
    TRITON = "triton"


class ConfigError(HeadprobeError, ValueError):
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
        qk_norm: RMS-normalise each query and key head over its ``qk_head_dim`` dims (a learned gain per
            dim, shared by the heads) before RoPE, as OLMo 2, Qwen 3 and Gemma 3 do: a logit
            ``q.k / sqrt(d)`` is then at most ``sqrt(d)`` times the gains' product, however large the
            projections grow.
        qk_norm_scale: with ``qk_norm``, the softmax scale is ``qk_norm_scale / qk_head_dim`` instead of
            ``1 / sqrt(qk_head_dim)``: a logit is then at most ``qk_norm_scale`` times the gains' product
            (the cosine of the normalised query and key times a temperature, as Henry et al. 2020's QKNorm),
            the same bound for every head width. ``None``: the bound grows as ``sqrt(qk_head_dim)`` (4 for a
            16-wide head, 8 for a 64-wide one), which at toy widths caps how sharply a narrow head can attend
            (docs/training.md). Unset without ``qk_norm``.
    """

    n_heads: int
    qk_head_dim: int
    v_head_dim: int
    n_kv_heads: int | None = None
    rope_dim: int = 0
    rope_theta: float = 10_000.0
    window: int | None = None
    qk_norm: bool = False
    qk_norm_scale: float | None = None

    @property
    def kv_heads(self) -> int:
        """The effective number of key/value heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def scale(self) -> float:
        """Softmax scale: ``1 / sqrt(qk_head_dim)``, or ``qk_norm_scale / qk_head_dim`` when set."""
        if self.qk_norm_scale is not None:
            return self.qk_norm_scale / self.qk_head_dim
        return self.qk_head_dim**-0.5

    def validate(self, where: str = "attention") -> None:
        """Raise :class:`ConfigError` naming the bad field and the fix."""
        for name in ("n_heads", "qk_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise ConfigError(f"{where}.{name} must be a positive integer, got {value!r}")
        if not _whole(self.rope_dim):
            raise ConfigError(f"{where}.rope_dim must be a non-negative even integer, got {self.rope_dim!r}")
        if not _number(self.rope_theta):
            raise ConfigError(f"{where}.rope_theta must be a positive number, got {self.rope_theta!r}")
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
        if not isinstance(self.qk_norm, bool):
            raise ConfigError(f"{where}.qk_norm must be true or false, got {self.qk_norm!r}")
        if self.qk_norm_scale is not None:
            if not _number(self.qk_norm_scale) or self.qk_norm_scale <= 0:
                raise ConfigError(
                    f"{where}.qk_norm_scale must be a positive number or null, got {self.qk_norm_scale!r}"
                )
            if not self.qk_norm:
                raise ConfigError(
                    f"{where}.qk_norm_scale={self.qk_norm_scale} needs qk_norm: true (it bounds the logits of "
                    "normalised queries and keys); set qk_norm or drop qk_norm_scale"
                )
        if self.window is not None and (not isinstance(self.window, int) or self.window < 1):
            raise ConfigError(
                f"{where}.window={self.window!r} must be an integer >= 1 (keys seen including the "
                "query's own) or null for full causal attention"
            )


def _whole(value: object) -> bool:
    """Whether a config value is an integer (JSON's ``true`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    """Whether a config value is a finite number (an integer or a float; not ``true``, not a string)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class LayerInfo:
    """Attention geometry of one layer of any model (ours or a Hugging Face one).

    Attributes:
        index: 0-based layer index.
        layer_type: sliding-window or full attention.
        n_heads: query heads.
        n_kv_heads: key/value heads.
        qk_dim: query/key width.
        v_dim: value width.
        window: keys visible per query including its own (``None`` = full causal).
    """

    index: int
    layer_type: LayerType
    n_heads: int
    n_kv_heads: int
    qk_dim: int
    v_dim: int
    window: int | None

    @classmethod
    def of(cls, index: int, layer_type: LayerType, att: AttentionConfig) -> LayerInfo:
        return cls(index, layer_type, att.n_heads, att.kv_heads, att.qk_head_dim, att.v_head_dim, att.window)


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
        """``LayerType.FULL`` for layers ``full_every-1, 2*full_every-1, ...``, else ``"sliding"``."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range for n_layers={self.n_layers}")
        return LayerType.FULL if (layer + 1) % self.full_every == 0 else LayerType.SLIDING

    def layer_types(self) -> list[LayerType]:
        return [self.layer_type(i) for i in range(self.n_layers)]

    def attention(self, layer: int) -> AttentionConfig:
        """The attention shape of ``layer``."""
        return self.full if self.layer_type(layer) is LayerType.FULL else self.swa

    def layer_infos(self) -> list[LayerInfo]:
        """The attention geometry of every layer, as hooks and memory estimates see it."""
        return [LayerInfo.of(i, self.layer_type(i), self.attention(i)) for i in range(self.n_layers)]

    # -- validation ------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the bad field, what it must be and what it holds."""
        for name in ("vocab_size", "d_model", "n_layers", "d_ff", "full_every", "max_seq_len"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("norm_eps", "init_std"):
            if not _number(getattr(self, name)) or getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be a positive number, got {getattr(self, name)!r}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise ConfigError(f"name must be a string or null, got {self.name!r}")
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

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if "model_type" in unknown:  # every Hugging Face config.json names its model_type; ours never does
            raise ConfigError(
                f"a Hugging Face config.json (model_type {data['model_type']!r}), not a headprobe model "
                f"config (fields {', '.join(sorted(known))}); give one of ours (a checkpoint's config.json, or a "
                "preset), or give the Hugging Face model's folder to a command that loads models"
            )
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
        if why := not_a(path, "file"):
            raise FileNotFoundError(f"model config {path} {why}")
        if is_gguf(path):
            raise ConfigError(
                f"{path} is a GGUF file, not a headprobe model config: give one of ours (a checkpoint's config.json, "
                "or a preset); a GGUF file goes to the commands that load models (e.g. `headprobe analyze`)"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"{path} is not UTF-8 text; give a model config JSON file") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
                type(data), "a number"
            )
            raise ConfigError(
                f"{path} holds {kind}, expected a JSON object (a model config such as a checkpoint's config.json, "
                "with its 'swa' and 'full' blocks)"
            )
        try:
            return cls.from_dict(data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
