"""Configuration of the head-shape decoder (headprobe's model family) for transformers.

Standalone: this file imports transformers only, never headprobe, so that a folder written by
``headprobe export hf`` loads anywhere with ``trust_remote_code=True``.

The model is a stack of pre-norm blocks whose attention layers come in two types, each with its own
shape: ``layer_types[i]`` is ``"sliding_attention"`` or ``"full_attention"``, and ``attention[type]``
gives that type's

* ``num_attention_heads`` (query heads) and ``num_key_value_heads`` (grouped-query attention),
* ``qk_head_dim`` (the width of each query/key head: the dot-product dimension) and ``v_head_dim`` (the
  width of each value head; the output projection reads ``num_attention_heads * v_head_dim``),
* ``rope_dim`` (how many of the ``qk_head_dim`` dims RoPE rotates, as two halves, NeoX style; the rest
  pass through) and ``rope_theta``,
* ``qk_norm`` (optional, default false: each query and key head RMS-normalised over its ``qk_head_dim``
  dims, with one learned gain per dim, before RoPE; weights ``self_attn.q_norm`` / ``k_norm``) and
  ``qk_norm_scale`` (optional, with ``qk_norm``: the softmax scale is ``qk_norm_scale / qk_head_dim``).

Sliding-window layers see ``sliding_window`` keys including the query's own (query ``i`` sees keys
``i - sliding_window + 1 .. i``, transformers' convention too). The softmax scale is
``qk_head_dim ** -0.5`` unless ``qk_norm_scale`` says otherwise. The top-level ``num_attention_heads``,
``num_key_value_heads`` and ``head_dim`` repeat the full-attention layers' shape for tools that read one
shape; the per-type ``attention`` is what the model uses.
"""

from __future__ import annotations

from typing import Any, ClassVar

try:
    from transformers import PreTrainedConfig
except ImportError:  # transformers before 5
    from transformers import PretrainedConfig as PreTrainedConfig

LAYER_TYPES = ("sliding_attention", "full_attention")
SHAPE_KEYS = ("num_attention_heads", "num_key_value_heads", "qk_head_dim", "v_head_dim", "rope_dim", "rope_theta")


class HeadShapeConfig(PreTrainedConfig):
    """The head-shape decoder's configuration (see the module docstring)."""

    model_type = "headshape"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 264,
        hidden_size: int = 64,
        intermediate_size: int = 256,
        num_hidden_layers: int = 4,
        layer_types: list[str] | None = None,
        attention: dict[str, dict[str, Any]] | None = None,
        sliding_window: int | None = None,
        rms_norm_eps: float = 1e-6,
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        bos_token_id: int | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.layer_types = list(layer_types or ["full_attention"] * num_hidden_layers)
        default = {"num_attention_heads": 4, "num_key_value_heads": 4, "qk_head_dim": 16, "v_head_dim": 16,
                   "rope_dim": 16, "rope_theta": 10000.0}  # fmt: skip
        self.attention = {kind: dict((attention or {}).get(kind, default)) for kind in LAYER_TYPES}
        self.sliding_window = sliding_window
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        full = self.attention["full_attention"]
        self.num_attention_heads = full["num_attention_heads"]
        self.num_key_value_heads = full["num_key_value_heads"]
        self.head_dim = full["qk_head_dim"]
        self._check()
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def _check(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - set(LAYER_TYPES):
            raise ValueError(
                f"layer_types must name {self.num_hidden_layers} layers, each one of {LAYER_TYPES}; "
                f"got {self.layer_types}"
            )
        if "sliding_attention" in self.layer_types and not self.sliding_window:
            raise ValueError("the config has sliding_attention layers but no sliding_window")
        for kind, shape in self.attention.items():
            missing = [k for k in SHAPE_KEYS if k not in shape]
            if missing:
                raise ValueError(f"attention[{kind!r}] lacks {missing}")
            if shape["num_attention_heads"] % shape["num_key_value_heads"]:
                raise ValueError(f"attention[{kind!r}]: num_attention_heads is not a multiple of num_key_value_heads")
            if shape["rope_dim"] % 2 or not 0 <= shape["rope_dim"] <= shape["qk_head_dim"]:
                raise ValueError(f"attention[{kind!r}]: rope_dim must be even and at most qk_head_dim")
