"""The head-shape decoder (headprobe's model family) as transformers code.

Standalone: this file imports torch and transformers only, never headprobe, so that a folder written by
``headprobe export hf`` loads anywhere with ``trust_remote_code=True``. It follows transformers'
conventions so that other tools can drive it: attention through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` (``eager``, ``sdpa``), masks from
``transformers.masking_utils``, the ``Cache`` API for generation (a sliding-window layer's cache keeps
only what its window needs), ``post_init()``.

    x = embed_tokens(ids)
    for each layer l (its type: layer_types[l], its shape: attention[layer_types[l]]):
        x = x + o_proj(attend(rope(q_proj(norm x)), rope(k_proj(norm x)), v_proj(norm x)))
        x = x + down_proj(silu(gate_proj(norm x)) * up_proj(norm x))
    logits = lm_head(norm x)

Queries and keys are ``qk_head_dim`` wide, values ``v_head_dim``; RoPE rotates the first ``rope_dim``
dims of each query/key head as two halves (NeoX layout), its angles made in float64.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration_headshape import HeadShapeConfig

# transformers 5 names the cache `cache` in model outputs, earlier versions `past_key_values`
_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """Norms and rotations of half-precision activations are computed in float32."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class HeadShapeRMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = x.to(_work_dtype(x.dtype))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


class HeadShapeRotary(nn.Module):
    """The RoPE angles of one layer type: ``cos, sin: [batch, 1, seq, rope_dim/2]`` at ``position_ids:
    [batch, seq]`` (made in float64, then in ``like``'s working precision), once per forward pass for every
    layer of the type; ``None`` without RoPE."""

    def __init__(self, rope_dim: int, theta: float) -> None:
        super().__init__()
        self.rope_dim, self.theta = rope_dim, theta

    def forward(self, position_ids: Tensor, like: Tensor) -> tuple[Tensor, Tensor] | None:
        if self.rope_dim == 0:
            return None
        half, work = self.rope_dim // 2, _work_dtype(like.dtype)
        inv_freq = self.theta ** (-torch.arange(half, dtype=torch.float64, device=like.device) * 2 / self.rope_dim)
        angles = position_ids.to(device=like.device, dtype=torch.float64)[..., None] * inv_freq  # [batch, seq, half]
        return angles.cos().to(work)[:, None], angles.sin().to(work)[:, None]


def apply_rotary(x: Tensor, rope: tuple[Tensor, Tensor] | None) -> Tensor:
    """``x: [batch, heads, seq, dim]`` with its first ``rope_dim`` dims rotated as two halves (NeoX layout) by
    ``rope`` (:class:`HeadShapeRotary`); the other dims pass through."""
    if rope is None:
        return x
    cos, sin = rope
    half = cos.shape[-1]
    a, b = x[..., :half].to(cos.dtype), x[..., half : 2 * half].to(cos.dtype)
    rotated = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)
    return torch.cat([rotated, x[..., 2 * half :]], dim=-1)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """``[batch, kv_heads, seq, dim]`` -> ``[batch, kv_heads * groups, seq, dim]``: each key/value head
    serves ``groups`` consecutive query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def eager_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T * scaling + mask) v``: ``query: [batch, heads, q_len, qk_dim]``, ``key: [batch,
    kv_heads, k_len, qk_dim]``, ``value: [batch, kv_heads, k_len, v_dim]`` -> ``[batch, q_len, heads, v_dim]``
    and the weights ``[batch, heads, q_len, k_len]``."""
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = F.softmax(weights, dim=-1, dtype=_work_dtype(query.dtype)).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class HeadShapeAttention(nn.Module):
    """Grouped-query causal attention with its own query/key and value widths."""

    def __init__(self, config: HeadShapeConfig, layer_idx: int) -> None:
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.layer_type = config.layer_types[layer_idx]
        shape = config.attention[self.layer_type]
        self.num_heads, self.num_key_value_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.qk_head_dim, self.v_head_dim = shape["qk_head_dim"], shape["v_head_dim"]
        self.head_dim = self.qk_head_dim
        scale = shape.get("qk_norm_scale")  # with qk_norm: a width-independent bound on the logits
        self.scaling = self.qk_head_dim**-0.5 if scale is None else scale / self.qk_head_dim
        self.sliding_window = config.sliding_window if self.layer_type == "sliding_attention" else None
        self.is_causal = True
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.qk_head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_key_value_heads * self.qk_head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_key_value_heads * self.v_head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.v_head_dim, d, bias=False)
        self.qk_norm = bool(shape.get("qk_norm", False))
        if self.qk_norm:  # each head over its qk_head_dim dims, before RoPE
            self.q_norm = HeadShapeRMSNorm(self.qk_head_dim, config.rms_norm_eps)
            self.k_norm = HeadShapeRMSNorm(self.qk_head_dim, config.rms_norm_eps)

    def forward(
        self, hidden_states: Tensor, rope: tuple[Tensor, Tensor] | None, attention_mask: Tensor | None,
        cache: Cache | None = None, **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
        b, n, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, n, self.num_heads, self.qk_head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, n, self.num_key_value_heads, self.qk_head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, n, self.num_key_value_heads, self.v_head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        interface: Callable = eager_attention_forward
        if self.config._attn_implementation != "eager":
            interface = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        out, weights = interface(
            self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, sliding_window=self.sliding_window,
            **kwargs,
        )  # fmt: skip
        return self.o_proj(out.reshape(b, n, self.num_heads * self.v_head_dim)), weights


class HeadShapeMLP(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: HeadShapeConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HeadShapeDecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then the SwiGLU MLP."""

    def __init__(self, config: HeadShapeConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = HeadShapeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = HeadShapeAttention(config, layer_idx)
        self.post_attention_layernorm = HeadShapeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = HeadShapeMLP(config)

    def forward(
        self, hidden_states: Tensor, rope: tuple[Tensor, Tensor] | None, attention_mask: Tensor | None,
        cache: Cache | None = None, **kwargs: Any,
    ) -> Tensor:  # fmt: skip
        attended, _ = self.self_attn(self.input_layernorm(hidden_states), rope, attention_mask, cache, **kwargs)
        hidden_states = hidden_states + attended
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class HeadShapePreTrainedModel(PreTrainedModel):
    config_class = HeadShapeConfig
    config: HeadShapeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules: ClassVar[list[str]] = ["HeadShapeDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = False  # FlashAttention needs one width for queries, keys and values
    _supports_flex_attn = False
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, HeadShapeRMSNorm):
            nn.init.ones_(module.weight)


class HeadShapeModel(HeadShapePreTrainedModel):
    """The decoder without its LM head: ``last_hidden_state: [batch, seq, hidden_size]``."""

    def __init__(self, config: HeadShapeConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HeadShapeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = HeadShapeRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = nn.ModuleDict({
            kind: HeadShapeRotary(config.attention[kind]["rope_dim"], float(config.attention[kind]["rope_theta"]))
            for kind in sorted(set(config.layer_types))
        })  # fmt: skip
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        for unused in ("output_attentions", "output_hidden_states", "return_dict", "cache_position"):
            kwargs.pop(unused, None)
        cache = cache if cache is not None else past_key_values
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = DynamicCache(config=self.config)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past)[None]
        masks = attention_mask
        if not isinstance(masks, dict):  # generate() may have made them already
            args = dict(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                        position_ids=position_ids)  # fmt: skip
            args[_CACHE_FIELD] = cache
            masks = {"full_attention": create_causal_mask(**args)}
            if "sliding_attention" in self.config.layer_types:
                masks["sliding_attention"] = create_sliding_window_causal_mask(**args)
        hidden_states = inputs_embeds
        rope = {kind: rotary(position_ids, inputs_embeds) for kind, rotary in self.rotary.items()}  # once per type
        for layer, kind in zip(self.layers, self.config.layer_types, strict=True):
            hidden_states = layer(hidden_states, rope[kind], masks[kind], cache, **kwargs)
        return BaseModelOutputWithPast(
            last_hidden_state=self.norm(hidden_states), **{_CACHE_FIELD: cache if use_cache else None}
        )


class HeadShapeForCausalLM(HeadShapePreTrainedModel, GenerationMixin):
    """The decoder and its LM head: ``logits: [batch, seq, vocab_size]`` (the head tied to the embedding
    when ``tie_word_embeddings``)."""

    _tied_weights_keys: ClassVar[dict[str, str]] = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: HeadShapeConfig) -> None:
        super().__init__(config)
        self.model = HeadShapeModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()  # input embeddings: PreTrainedModel finds them in `model` (base_model_prefix)

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: Tensor | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | Tensor = 0,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            cache=cache if cache is not None else past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            **kwargs,
        )  # fmt: skip
        hidden = out.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden[:, keep])
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)})


__all__ = ["HeadShapeForCausalLM", "HeadShapeModel", "HeadShapePreTrainedModel"]
