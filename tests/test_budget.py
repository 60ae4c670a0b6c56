"""The planner's arithmetic against real models, brute-force counting and hand-worked numbers."""

import pytest
import torch
from reference import param_count
from torch.utils.flop_counter import FlopCounterMode

from headprobe.model.budget import budget, mean_visible_keys
from headprobe.model.config import AttentionConfig
from headprobe.model.presets import list_presets, preset
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config


@pytest.mark.parametrize("name", list_presets())
def test_params_match_the_built_model(name):
    with torch.device("meta"):
        model = Transformer(preset(name))
    b = budget(preset(name))
    assert b.params == param_count(model)
    attn = sum(p.numel() for n, p in model.named_parameters() if ".attn." in n and "_norm." not in n)
    assert b.attn_params == attn  # the attention budget: the projections


def test_params_count_the_qk_norm_gains():
    from headprobe.model.config import AttentionConfig

    cfg = tiny_config(full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, qk_norm=True))
    assert budget(cfg).params == param_count(Transformer(cfg)) == param_count(Transformer(tiny_config())) + 2 * 16


@pytest.mark.parametrize("seq_len, window", [(1, None), (10, None), (10, 3), (10, 10), (10, 40), (1000, 64)])
def test_mean_visible_keys_brute_force(seq_len, window):
    count = sum(min(i + 1, window or i + 1) for i in range(seq_len))
    assert mean_visible_keys(seq_len, window) == pytest.approx(count / seq_len)


def test_matmul_flops_match_torch_flop_counter():
    """torch's FLOP counter measures the forward independently. With the dense reference backend it
    counts every score of the L x L matrix (masked ones too): 2 * heads * (qk + v) * L^2 per layer;
    the rest must be the budget's linear-layer FLOPs, 2 * N_matmul per token."""
    cfg = tiny_config()
    model = Transformer(cfg)
    model.set_attention_backend("reference")
    seq_len = 7
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randint(0, 40, (1, seq_len)))
    dense_attn = sum(
        2 * a.n_heads * (a.qk_head_dim + a.v_head_dim) * seq_len**2 for a in map(cfg.attention, range(cfg.n_layers))
    )
    b = budget(cfg, seq_len)
    linear_per_token = (b.flops_per_token - b.attn_flops_per_token) / 3
    assert counter.get_total_flops() == linear_per_token * seq_len + dense_attn


def test_attention_flops_and_kv_hand_worked():
    # one full layer (2 heads, qk 16, v 4) + three sliding layers (4 heads, qk 8, v 8, window 5, 2 kv heads)
    cfg = tiny_config()
    b = budget(cfg, seq_len=10)
    full_keys = 5.5  # (10 + 1) / 2
    swa_keys = (1 + 2 + 3 + 4 + 5 * 6) / 10
    attn_fwd = 2 * 2 * (16 + 4) * full_keys + 3 * 2 * 4 * (8 + 8) * swa_keys
    assert b.attn_flops_per_token == pytest.approx(3 * attn_fwd)
    # KV: full layer 2 kv heads * (16 + 4) values * 10 tokens, sliding: 2 * (8 + 8) * 5 tokens each; bf16
    kv_bytes = (2 * 20 * 10 + 3 * 2 * 16 * 5) * 2
    assert b.kv_cache_bytes == kv_bytes and b.kv_bytes_per_token == kv_bytes / 10
    assert b.kv_bytes_per_new_token == 2 * 20 * 2


def test_grid_tradeoffs_at_long_context():
    """At 256K the KV cache grows only through the full layers, so k512v128 and k128v512 (same
    qk+v total) cost the same, and both less than d128 whose heads hold 128+128 per head x 16."""
    rows = {n: budget(preset(n), 262_144) for n in list_presets("0.6b")}
    assert rows["0.6b-d128"].kv_bytes_per_new_token == 7 * 16 * (128 + 128) * 2
    assert rows["0.6b-k512v128"].kv_bytes_per_new_token == 7 * 4 * (512 + 128) * 2
    assert rows["0.6b-d512"].kv_cache_bytes == rows["0.6b-d128"].kv_cache_bytes


def test_gqa_shrinks_kv_not_queries():
    gqa = tiny_config(full=AttentionConfig(n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=1, rope_dim=8))
    mha = tiny_config(full=AttentionConfig(n_heads=4, qk_head_dim=8, v_head_dim=8, rope_dim=8))
    assert budget(gqa, 100).kv_bytes_per_new_token * 4 == budget(mha, 100).kv_bytes_per_new_token
    assert budget(gqa, 100).attn_flops_per_token == budget(mha, 100).attn_flops_per_token
