"""What a model configuration costs: parameters, training FLOPs per token and KV-cache bytes.

Everything is computed from :class:`~headprobe.model.config.ModelConfig` alone (no model is built), so the
planner can price a 3B grid instantly; ``tests/test_budget.py`` checks the parameter count against
real models. Conventions:

* **Parameters**: distinct parameters; a tied LM head counts once.
* **FLOPs** count multiply-adds as 2 FLOPs. Forward matmuls cost ``2 * N_matmul`` per token, where
  ``N_matmul`` holds every linear weight including the LM head (but not the embedding lookup).
  Attention adds ``2 * heads * (qk_dim + v_dim)`` per visible key: ``q.k`` scores and the weighted
  sum of values. Visible keys are counted *causally and window-aware*: a full layer at sequence
  length ``L`` averages ``(L+1)/2`` keys per query, a sliding layer ``mean_i min(i+1, W)`` -- never
  ``L^2``. Training = forward + backward = 3 x forward. (MosaicML's MFU tables count non-causal
  ``L^2``; our numbers are the work actually done, so our MFU is not inflated.)
* **KV cache** at sequence length ``L``: every layer stores ``kv_heads * (qk_dim + v_dim)`` values
  per cached token; full layers cache ``L`` tokens, sliding layers only ``min(L, W)``.
  ``kv_bytes_per_token`` is that total divided by ``L``; ``kv_bytes_per_new_token`` is what one more
  token adds once ``L > W`` (full layers only) -- the cost that dominates at 128K-256K.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from headprobe.model.config import AttentionConfig, LayerInfo, LayerType, ModelConfig


def attention_params(att: AttentionConfig, d_model: int) -> int:
    """Weights of one attention layer: q, k, v and o projections (no biases)."""
    q = d_model * att.n_heads * att.qk_head_dim
    k = d_model * att.kv_heads * att.qk_head_dim
    v = d_model * att.kv_heads * att.v_head_dim
    o = att.n_heads * att.v_head_dim * d_model
    return q + k + v + o


def kv_values_per_token(info: LayerInfo) -> int:
    """Values one layer caches per token: ``kv_heads * (qk_dim + v_dim)``."""
    return info.n_kv_heads * (info.qk_dim + info.v_dim)


def cached_tokens(info: LayerInfo, tokens: int) -> int:
    """Tokens one layer's cache holds after ``tokens`` tokens: all for full layers, at most ``window``
    for sliding layers (the next query's window, its own key included)."""
    return tokens if info.window is None else min(tokens, info.window)


def kv_cache_bytes(layers: Sequence[LayerInfo], tokens: int, bytes_per_value: int) -> int:
    """Bytes of one sequence's KV cache after ``tokens`` tokens, over ``layers``."""
    return sum(bytes_per_value * kv_values_per_token(i) * cached_tokens(i, tokens) for i in layers)


def mean_visible_keys(seq_len: int, window: int | None) -> float:
    """Average number of keys a query sees over positions ``0 .. seq_len-1`` (causal, windowed)."""
    if window is None or window >= seq_len:
        return (seq_len + 1) / 2
    # positions 0..W-1 see i+1 keys, the remaining L-W positions see W keys
    ramp = window * (window + 1) / 2
    return (ramp + (seq_len - window) * window) / seq_len


@dataclass(frozen=True)
class Budget:
    """Costs of one configuration at one sequence length (see module docstring for conventions)."""

    name: str
    seq_len: int
    params: int
    embedding_params: int
    attn_params: int
    attn_params_swa: int
    attn_params_full: int
    mlp_params: int
    n_swa_layers: int
    n_full_layers: int
    full_heads: int
    full_qk_dim: int
    full_v_dim: int
    flops_per_token: float
    attn_flops_per_token: float
    kv_bytes_per_token: float
    kv_bytes_per_new_token: int
    kv_cache_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def budget(cfg: ModelConfig, seq_len: int | None = None, bytes_per_value: int = 2) -> Budget:
    """Price ``cfg`` at ``seq_len`` tokens (default ``cfg.max_seq_len``); KV values of ``bytes_per_value``
    bytes (2 = bf16)."""
    seq_len = cfg.max_seq_len if seq_len is None else seq_len
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    d = cfg.d_model
    types = cfg.layer_types()
    n_full = types.count(LayerType.FULL)
    n_swa = len(types) - n_full
    attn_swa = n_swa * attention_params(cfg.swa, d)
    attn_full = n_full * attention_params(cfg.full, d)
    mlp = cfg.n_layers * 3 * d * cfg.d_ff
    norms = (2 * cfg.n_layers + 1) * d + sum(
        2 * cfg.attention(i).qk_head_dim for i in range(cfg.n_layers) if cfg.attention(i).qk_norm
    )
    embedding = cfg.vocab_size * d
    lm_head = 0 if cfg.tie_embeddings else cfg.vocab_size * d
    params = embedding + lm_head + attn_swa + attn_full + mlp + norms

    matmul_params = attn_swa + attn_full + mlp + cfg.vocab_size * d
    layers = cfg.layer_infos()
    attn_flops = sum(2 * i.n_heads * (i.qk_dim + i.v_dim) * mean_visible_keys(seq_len, i.window) for i in layers)
    kv_bytes = kv_cache_bytes(layers, seq_len, bytes_per_value)
    kv_new = sum(kv_values_per_token(i) for i in layers if i.window is None)
    forward = 2 * matmul_params + attn_flops
    return Budget(
        name=cfg.name or "custom",
        seq_len=seq_len,
        params=params,
        embedding_params=embedding,
        attn_params=attn_swa + attn_full,
        attn_params_swa=attn_swa,
        attn_params_full=attn_full,
        mlp_params=mlp,
        n_swa_layers=n_swa,
        n_full_layers=n_full,
        full_heads=cfg.full.n_heads,
        full_qk_dim=cfg.full.qk_head_dim,
        full_v_dim=cfg.full.v_head_dim,
        flops_per_token=3 * forward,
        attn_flops_per_token=3 * attn_flops,
        kv_bytes_per_token=kv_bytes / seq_len,
        kv_bytes_per_new_token=kv_new * bytes_per_value,
        kv_cache_bytes=kv_bytes,
    )


# ---------------------------------------------------------------------------------------------
# Memory of analysis and evaluation passes (batch 1, no gradients)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of one pass, by what holds them."""

    weights: int
    activations: int
    statistics: int = 0
    kv_cache: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.statistics + self.kv_cache

    def describe(self) -> str:
        gib = 2**30
        return (
            f"{self.total / gib:.2f} GiB (weights {self.weights / gib:.2f}, activations {self.activations / gib:.2f}, "
            f"statistics {self.statistics / gib:.2f}, KV cache {self.kv_cache / gib:.2f})"
        )


def forward_activation_bytes(layers: Sequence[LayerInfo], d_model: int, d_ff: int, tokens: int) -> int:
    """Peak activations of a forward pass over ``tokens`` tokens: the residual stream, one layer's
    q/k/v/o and MLP hidden states in float32, times 2 for temporaries."""
    widest = max(info.n_heads * info.qk_dim for info in layers)
    return 2 * 4 * tokens * (3 * d_model + 4 * widest + 3 * d_ff)


STATS_TILE_KEYS = 8192  # widest key tile of the streaming statistics (headprobe.stats.engine)


KENDALL_PAIRS = 2**22  # key pairs token reordering compares at once (rows x topk x topk), at least one row's
KENDALL_PAIR_BYTES = 48  # its float64 and boolean temporaries per pair


def kendall_chunk(topk: int) -> int:
    """Rows token reordering (:func:`headprobe.metrics.attention.kendall_reordering`) takes at once: as many as
    keep ``rows x topk x topk`` within :data:`KENDALL_PAIRS` pairs, at least one."""
    return max(1, KENDALL_PAIRS // max(1, topk * topk))


def statistics_bytes(layers: Sequence[LayerInfo], rows: int, topk: int) -> int:
    """The streaming statistics of one layer: a few float32 score tiles of up to 1,024 rows by
    ``STATS_TILE_KEYS`` keys per head, plus the per-row outputs (10 values and ``2 * topk``), and with
    ``topk`` token reordering's pairwise comparison of the top keys (``topk x topk`` pairs per row, a chunk of
    rows at a time: :func:`kendall_chunk`)."""
    heads = max(info.n_heads for info in layers)
    tiles = 6 * 4 * heads * min(rows, 1024) * STATS_TILE_KEYS
    pairs = KENDALL_PAIR_BYTES * min(heads * rows, kendall_chunk(topk)) * topk * topk if topk else 0
    return tiles + 8 * heads * rows * (10 + 2 * topk) + pairs


def pass_memory(
    layers: Sequence[LayerInfo],
    weights: int,
    d_model: int,
    d_ff: int,
    tokens: int,
    *,
    rows: int = 0,
    topk: int = 0,
    cached_tokens: int = 0,
    bytes_per_value: int = 4,
) -> MemoryEstimate:
    """Peak memory of one pass over ``tokens`` tokens: ``weights`` bytes, activations, the streaming
    statistics of ``rows`` rows (0 = none) and, when decoding, the KV cache after ``cached_tokens``."""
    return MemoryEstimate(
        weights=weights,
        activations=forward_activation_bytes(layers, d_model, d_ff, tokens),
        statistics=statistics_bytes(layers, rows, topk) if rows else 0,
        kv_cache=kv_cache_bytes(layers, cached_tokens, bytes_per_value) if cached_tokens else 0,
    )
