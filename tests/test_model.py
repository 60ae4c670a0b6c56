"""The model against an independent dense float64 implementation, plus hooks and decoding."""

from __future__ import annotations

import copy

import pytest
import torch
from reference import complex_rope, dense_forward, param_count

from headprobe.model.config import AttentionConfig
from headprobe.model.kv_cache import KVCache
from headprobe.model.presets import list_presets, preset
from headprobe.model.seam import AttentionCall
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_embeddings": False},
        {"full": AttentionConfig(n_heads=4, qk_head_dim=4, v_head_dim=16, n_kv_heads=1, rope_dim=0)},
        {"full_every": 1, "full": AttentionConfig(n_heads=2, qk_head_dim=8, v_head_dim=8, rope_dim=8)},
        {"full": AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, qk_norm=True)},
        {
            "swa": AttentionConfig(
                n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=2, rope_dim=8, window=5, qk_norm=True
            )
        },
        {  # a width-independent logit bound: softmax scale qk_norm_scale / qk_head_dim in both layer types
            "swa": AttentionConfig(
                n_heads=4, qk_head_dim=8, v_head_dim=8, rope_dim=8, window=5, qk_norm=True, qk_norm_scale=3.0
            ),
            "full": AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, qk_norm=True, qk_norm_scale=12.0),
        },
    ],
)
@pytest.mark.parametrize("backend", ["sdpa", "reference"])
def test_forward_matches_dense_reference(overrides, backend):
    model = Transformer(tiny_config(**overrides)).double()
    with torch.no_grad():  # gains other than 1, so that a norm applied without its weight would differ
        for name, param in model.named_parameters():
            if name.endswith("_norm.weight"):
                param.uniform_(0.5, 2.0)
    model.set_attention_backend(backend)
    ids = torch.randint(0, 40, (2, 23))
    torch.testing.assert_close(model(ids), dense_forward(model, ids), atol=1e-10, rtol=0)


def test_float32_forward_close_to_float64():
    model = Transformer(tiny_config())
    ids = torch.randint(0, 40, (2, 30))
    torch.testing.assert_close(model(ids).double(), dense_forward(model, ids), atol=2e-5, rtol=1e-5)


def test_layer_types_follow_full_every():
    cfg = preset("0.6b-d512")
    assert [i for i, t in enumerate(cfg.layer_types()) if t == "full"] == list(range(3, 28, 4))
    model = Transformer(tiny_config(n_layers=8))
    types = [block.attn.layer_type for block in model.blocks]
    assert types == ["sliding", "sliding", "sliding", "full"] * 2
    assert model.blocks[3].attn.q_proj.weight.shape == (2 * 16, 32)
    assert model.blocks[3].attn.o_proj.weight.shape == (32, 2 * 4)  # o reads heads * v_head_dim


HOOKS = ["hook_embed", "ln_final.hook_normalized"] + [
    f"blocks.{layer}.{name}"
    for layer in range(4)
    for name in (
        "hook_resid_pre",
        "attn.hook_q",
        "attn.hook_k",
        "attn.hook_v",
        "attn.hook_rot_q",
        "attn.hook_rot_k",
        "attn.hook_z",
        "hook_attn_out",
        "hook_resid_mid",
        "hook_mlp_out",
        "hook_resid_post",
    )
]


def test_run_with_cache_hooks_are_consistent():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (1, 12))
    logits, cache = model.run_with_cache(ids)
    assert set(HOOKS) <= set(cache)
    assert not any("pattern" in name or "attn_scores" in name for name in cache)
    full = model.cfg.full
    assert cache["blocks.3.attn.hook_q"].shape == (1, 12, full.n_heads, full.qk_head_dim)
    assert cache["blocks.3.attn.hook_v"].shape == (1, 12, full.kv_heads, full.v_head_dim)
    assert cache["blocks.3.attn.hook_z"].shape == (1, 12, full.n_heads, full.v_head_dim)
    for layer in range(3):
        torch.testing.assert_close(
            cache[f"blocks.{layer}.hook_resid_post"], cache[f"blocks.{layer + 1}.hook_resid_pre"]
        )
    z = cache["blocks.3.attn.hook_z"].reshape(1, 12, -1)
    torch.testing.assert_close(z @ model.blocks[3].attn.o_proj.weight.T, cache["blocks.3.hook_attn_out"])
    rope = full.rope_dim
    want = complex_rope(cache["blocks.3.attn.hook_q"], torch.arange(12.0, dtype=torch.float64), rope, full.rope_theta)
    torch.testing.assert_close(cache["blocks.3.attn.hook_rot_q"], want, atol=1e-12, rtol=0)
    torch.testing.assert_close(model.lm_head(cache["ln_final.hook_normalized"]), logits)


def test_zeroing_a_head_in_hook_z_equals_zeroing_its_output_columns():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 15))
    head, v_dim = 1, model.cfg.full.v_head_dim

    def ablate(z, hook):
        z = z.clone()
        z[:, :, head] = 0
        return z

    hooked = model.run_with_hooks(ids, fwd_hooks=[("blocks.3.attn.hook_z", ablate)])
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.blocks[3].attn.o_proj.weight[:, head * v_dim : (head + 1) * v_dim] = 0
    torch.testing.assert_close(hooked, edited(ids))
    assert not torch.allclose(hooked, model(ids))  # the ablation mattered ...
    torch.testing.assert_close(model(ids), dense_forward(model, ids), atol=1e-10, rtol=0)  # ... and is gone


def test_hooks_are_removed_even_when_a_hook_raises():
    model = Transformer(tiny_config())

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(torch.randint(0, 40, (1, 5)), fwd_hooks=[("blocks.0.attn.hook_q", boom)])
    assert all(len(hp._forward_hooks) == 0 for hp in model.hook_dict.values())


def test_probe_sees_post_rope_q_k_with_window_and_scale():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (1, 9))
    seen: list[AttentionCall] = []
    _, cache = model.run_with_cache(ids)
    with model.hook(seen.append):
        model(ids)
    assert [c.layer for c in seen] == [0, 1, 2, 3]
    for c in seen:
        att = model.cfg.attention(c.layer)
        assert c.window == att.window and c.scale == pytest.approx(att.qk_head_dim**-0.5)
        assert c.layer_type == ("full" if c.layer == 3 else "sliding") and c.key_start == 0
        torch.testing.assert_close(c.q, cache[f"blocks.{c.layer}.attn.hook_rot_q"].transpose(1, 2))
        torch.testing.assert_close(c.k, cache[f"blocks.{c.layer}.attn.hook_rot_k"].transpose(1, 2))
    assert not model.seam.hooked  # detached when the context closed


def test_probe_key_start_during_decoding():
    model = Transformer(tiny_config())
    kv = KVCache(model.cfg)
    model(torch.randint(0, 40, (1, 12)), cache=kv)
    seen: list[AttentionCall] = []
    with model.hook(seen.append):
        model(torch.randint(0, 40, (1, 1)), cache=kv)
    by_layer = {c.layer: c for c in seen}
    # position 12: the sliding layers (window 5) hold keys 8..12, the full layer keys 0..12
    assert by_layer[0].key_start == 8 and by_layer[0].k.shape[2] == 5
    assert by_layer[3].key_start == 0 and by_layer[3].k.shape[2] == 13


def greedy_by_recompute(model, ids, n):
    seq = ids
    for _ in range(n):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, ids.shape[1] :]


@pytest.mark.parametrize("prompt_len", [1, 3, 17])
def test_generate_equals_repeated_full_forward_past_the_window(prompt_len):
    model = Transformer(tiny_config()).double()  # window 5: 20 new tokens run far past it
    ids = torch.randint(0, 40, (3, prompt_len))
    out = model.generate(ids, 20)
    assert out.shape == (3, 20)
    assert torch.equal(out, greedy_by_recompute(model, ids, 20))


def test_generate_toy_preset_past_its_window():
    model = Transformer(preset("toy-k64v16")).double()
    ids = torch.randint(0, 256, (1, 100))  # window 8
    assert torch.equal(model.generate(ids, 12), greedy_by_recompute(model, ids, 12))


def test_generate_stops_per_row():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 6))
    free = model.generate(ids, 10)
    stop = int(free[0, 2])  # row 0 emits this at step 2 (maybe earlier, too)
    first0 = int((free[0] == stop).nonzero()[0])
    out = model.generate(ids, 10, stop_ids=[stop])
    assert torch.equal(out[0, : first0 + 1], free[0, : first0 + 1])
    assert bool((out[0, first0:] == stop).all())
    hits1 = (free[1] == stop).nonzero()
    expected_len = max(first0, int(hits1[0]) if len(hits1) else 9) + 1
    assert out.shape[1] == expected_len


def test_sliding_cache_keeps_only_window_minus_one_keys():
    model = Transformer(tiny_config())
    kv = KVCache(model.cfg)
    model(torch.randint(0, 40, (1, 30)), cache=kv)
    for _ in range(3):
        model(torch.randint(0, 40, (1, 1)), cache=kv)
    assert kv.position == 33
    assert kv[0].k.shape[2] == 4 and kv[0].length == 4  # window 5 - 1
    assert kv[3].length == 33


def test_chunked_prefill_equals_one_pass():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 29))
    kv = KVCache(model.cfg)
    parts = [model(ids[:, a:b], cache=kv) for a, b in ((0, 11), (11, 12), (12, 29))]
    torch.testing.assert_close(torch.cat(parts, 1), model(ids), atol=1e-10, rtol=0)


def test_backward_matches_reference_backend():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 16))
    grads = {}
    for backend in ("reference", "sdpa"):
        model.zero_grad()
        model.set_attention_backend(backend)
        torch.nn.functional.cross_entropy(model(ids)[:, :-1].reshape(-1, 40), ids[:, 1:].reshape(-1)).backward()
        grads[backend] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for name, g in grads["reference"].items():
        torch.testing.assert_close(grads["sdpa"][name], g, atol=1e-10, rtol=0, msg=name)
    assert all(g.abs().sum() > 0 for g in grads["sdpa"].values())


def test_the_model_holds_exactly_the_weights_counted_by_hand_a_tied_head_once():
    model = Transformer(tiny_config())
    swa = 32 * 4 * 8 + 32 * 2 * 8 + 32 * 2 * 8 + 4 * 8 * 32  # q, k, v (2 kv heads), o
    full = 32 * 2 * 16 + 32 * 2 * 16 + 32 * 2 * 4 + 2 * 4 * 32
    by_hand = 40 * 32 + 3 * swa + full + 4 * 3 * 32 * 48 + 9 * 32  # embed, attn, SwiGLU, 9 norms
    assert param_count(model) == by_hand
    assert param_count(Transformer(tiny_config(tie_embeddings=False))) == by_hand + 40 * 32


@pytest.mark.parametrize("name", list_presets("toy"))
def test_toy_presets_run_forward_and_backward(name):
    model = Transformer(preset(name))
    ids = torch.randint(0, 256, (1, 130))
    loss = torch.nn.functional.cross_entropy(model(ids)[0, :-1], ids[0, 1:])
    loss.backward()
    assert 7.3 < loss.item() < 9.3  # near ln(4096) = 8.32 at init
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("recompute", [False, True], ids=["logits-kept", "logits-recomputed"])
def test_chunked_loss_equals_dense_cross_entropy_and_its_gradients(recompute, monkeypatch):
    import headprobe.model.transformer as transformer

    # a toy's chunks are below the size at which backward recomputes logits; a threshold of 0 forces it
    monkeypatch.setattr(transformer, "RECOMPUTE_LOGITS", 0 if recompute else 1 << 40)
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 19))
    targets = torch.randint(0, 40, (2, 19))
    mask = torch.rand(2, 19) < 0.6
    logits = model(ids)
    dense = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    dense = (dense * mask.flatten()).sum()
    dense.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chunked = model(ids, targets=targets, loss_mask=mask, loss_chunk=7)  # 38 positions in chunks of 7
    chunked.backward()
    assert chunked.item() == pytest.approx(dense.item(), rel=1e-6)  # summed in float32
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], atol=1e-6, rtol=1e-5, msg=name)


def test_count_correct_counts_the_masked_argmax_hits():
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 19))
    mask = torch.rand(2, 19) < 0.6
    with torch.no_grad():
        greedy = model(ids).argmax(-1)
    targets = torch.where(torch.rand(2, 19) < 0.5, greedy, (greedy + 1) % 40)  # about half predictable
    sums = model(ids, targets=targets, loss_mask=mask, loss_chunk=5, count_correct=True)
    assert int(sums.correct) == int(((greedy == targets) & mask).sum())
    # the loss is summed in float32 (whatever the model's dtype), in chunks of 5 here and of 8,192 there
    assert sums.loss.item() == pytest.approx(model(ids, targets=targets, loss_mask=mask).item(), rel=1e-6)


def test_a_batch_without_counted_targets_has_a_zero_loss_that_backpropagates():
    """A curriculum step can hold no target at all (e.g. only context); the loss is then 0 and backward
    still runs (it gives zero gradients rather than failing on a tensor without a graph)."""
    model = Transformer(tiny_config()).double()
    ids = torch.randint(0, 40, (2, 9))
    sums = model(ids, targets=ids, loss_mask=torch.zeros(2, 9, dtype=torch.bool), count_correct=True)
    sums.loss.backward()
    assert sums.loss.item() == 0.0 and int(sums.correct) == 0
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_qk_norm_bounds_every_attention_logit_however_large_the_projections():
    """With qk_norm each head's query and key have RMS 1 times their gains, so |q.k| / sqrt(d) <= sqrt(d) for
    unit gains (Cauchy-Schwarz on vectors of norm sqrt(d)), even with projections scaled up 1,000 times."""
    cfg = tiny_config(full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, qk_norm=True))
    model = Transformer(cfg).double()
    assert [n for n, _ in model.named_parameters() if "_norm" in n] == [
        "blocks.3.attn.q_norm.weight", "blocks.3.attn.k_norm.weight"
    ]  # fmt: skip
    assert all(float(p.min()) == float(p.max()) == 1.0 for n, p in model.named_parameters() if "_norm" in n)
    with torch.no_grad():
        model.blocks[3].attn.q_proj.weight.mul_(1000.0)
        model.blocks[3].attn.k_proj.weight.mul_(1000.0)
    _, cache = model.run_with_cache(torch.randint(0, 40, (1, 30)))
    q, k = cache["blocks.3.attn.hook_rot_q"], cache["blocks.3.attn.hook_rot_k"]  # [batch, pos, heads, dim]
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * 16**-0.5
    assert float(logits.abs().max()) <= 16**0.5 + 1e-9
    assert float(logits.abs().max()) > 1.0  # not trivially small: the bound is what holds them


@pytest.mark.parametrize("width", [8, 32])
def test_qk_norm_scale_bounds_every_logit_by_the_same_number_whatever_the_head_width(width):
    """With ``qk_norm_scale`` s a logit is s times the cosine of the normalised query and key (unit gains):
    at most s for a head of any width, where plain QK-norm's bound is sqrt(width). Queries and keys made
    parallel (identical projections, no RoPE) put the cosine of a token with itself at 1: the logit is s."""
    att = AttentionConfig(n_heads=1, qk_head_dim=width, v_head_dim=4, qk_norm=True, qk_norm_scale=5.0)
    assert att.scale == 5.0 / width
    model = Transformer(tiny_config(full=att)).double()
    with torch.no_grad():
        model.blocks[3].attn.k_proj.weight.copy_(model.blocks[3].attn.q_proj.weight * 1000.0)
    _, cache = model.run_with_cache(torch.randint(0, 40, (1, 30)))
    q, k = cache["blocks.3.attn.hook_rot_q"], cache["blocks.3.attn.hook_rot_k"]  # [batch, pos, heads, dim]
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * 5.0 / width
    assert float(logits.abs().max()) <= 5.0 + 1e-9
    assert torch.allclose(logits.diagonal(dim1=-2, dim2=-1), torch.full((1, 1, 30), 5.0, dtype=torch.float64))


def test_a_config_without_qk_norm_reads_as_before_and_a_bad_value_is_named():
    from headprobe.model.config import ConfigError, ModelConfig

    data = tiny_config().to_dict()
    for block in ("swa", "full"):
        data[block].pop("qk_norm")  # a config.json written before the option
    assert ModelConfig.from_dict(data) == tiny_config()
    data["full"]["qk_norm"] = "yes"
    with pytest.raises(ConfigError, match=r"full.qk_norm must be true or false, got 'yes'"):
        ModelConfig.from_dict(data)
    data["full"].update(qk_norm=False, qk_norm_scale=8.0)
    with pytest.raises(ConfigError, match=r"full.qk_norm_scale=8.0 needs qk_norm: true .*set qk_norm or drop"):
        ModelConfig.from_dict(data)
    data["full"].update(qk_norm=True, qk_norm_scale=-1)
    with pytest.raises(ConfigError, match=r"full.qk_norm_scale must be a positive number or null, got -1"):
        ModelConfig.from_dict(data)
