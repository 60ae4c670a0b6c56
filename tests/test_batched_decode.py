"""Batched decoding of prompts of different lengths (left-padded KV caches) against per-prompt decoding.

The model-level checks (our checkpoints and Hugging Face models) are in test_hooked_models.py."""

from __future__ import annotations

import pytest
import torch
from reference import complex_rope, loop_attention

from headprobe.hooked import HeadprobeModel
from headprobe.model.attention import AttentionBackendError, attention
from headprobe.model.kv_cache import KVCache
from headprobe.model.masks import KeyPadding
from headprobe.model.rope import Rotary
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config


def test_key_padding_equals_each_row_alone():
    """Row b of a left-padded call sees exactly what it would see without its padding keys."""
    torch.manual_seed(0)
    lengths, width = [9, 4, 1], 9
    q = torch.randn(3, 4, 1, 8, dtype=torch.float64)
    k = torch.randn(3, 2, width, 8, dtype=torch.float64)
    v = torch.randn(3, 2, width, 5, dtype=torch.float64)
    k[1, :, :5] = 1e30  # padding content must not leak, whatever finite values it holds
    v[1, :, :5] = -1e30
    k[2, :, :8], v[2, :, :8] = 0.0, 0.0
    start = torch.tensor([width - n for n in lengths])
    for window in (None, 3):
        out = attention(q, k, v, window=window, scale=0.3, padding=KeyPadding(start))
        for b, n in enumerate(lengths):
            want = loop_attention(q[b : b + 1], k[b : b + 1, :, width - n :], v[b : b + 1, :, width - n :], window, 0.3)
            torch.testing.assert_close(out[b : b + 1], want, atol=1e-12, rtol=0)


def test_key_padding_limits_are_named():
    q, k = torch.randn(2, 2, 65, 4), torch.randn(2, 2, 70, 4)
    with pytest.raises(AttentionBackendError, match="decoding"):
        attention(q, k, k, padding=KeyPadding(torch.zeros(2, dtype=torch.long)))
    with pytest.raises(AttentionBackendError, match="reference backend"):
        attention(q[:, :, :1], k, k, backend="sdpa", padding=KeyPadding(torch.zeros(2, dtype=torch.long)))
    with pytest.raises(ValueError, match=r"\[batch\]"):
        attention(q[:, :, :1], k, k, padding=KeyPadding(torch.zeros(3, dtype=torch.long)))


def test_rotary_per_row_offsets():
    x = torch.randn(3, 2, 4, 16, dtype=torch.float64)
    rot = Rotary(8, 10000.0)
    offsets = torch.tensor([0, 7, 1000])
    out = rot(x, offset=offsets)
    for b, o in enumerate(offsets.tolist()):
        want = complex_rope(x[b : b + 1], torch.arange(o, o + 2, dtype=torch.float64), 8, 10000.0)
        torch.testing.assert_close(out[b : b + 1], want, atol=1e-12, rtol=0)


def _model():
    torch.manual_seed(1)
    return Transformer(tiny_config()).double()  # window 5, full attention every 4th layer


def test_stacked_cache_steps_equal_each_prompt_alone():
    """Several decode steps on a stacked cache give each row's unpadded logits (float64)."""
    model = _model()
    lengths = [2, 4, 13, 30]  # below, at and far past the window of 5
    prompts = [torch.randint(0, 40, (1, n)) for n in lengths]
    caches = [KVCache(model.cfg) for _ in prompts]
    for p, c in zip(prompts, caches, strict=True):
        model(p, cache=c)
    stacked = KVCache.stack(caches)
    assert stacked.pad.tolist() == [28, 26, 17, 0]
    assert stacked[0].length == 4 and stacked[3].length == 30  # sliding keeps window - 1, full keeps all
    steps = torch.randint(0, 40, (4, 6))
    for s in range(steps.shape[1]):
        batched = model(steps[:, s : s + 1], cache=stacked)[:, -1]
        for b, c in enumerate(caches):
            alone = model(steps[b : b + 1, s : s + 1], cache=c)[:, -1]
            torch.testing.assert_close(batched[b : b + 1], alone, atol=1e-10, rtol=0)


def test_generate_list_equals_generate_each():
    model = _model()
    prompts = [torch.randint(0, 40, (1, n)) for n in (1, 3, 8, 21)]
    batched = model.generate(prompts, 15)
    for b, p in enumerate(prompts):
        assert torch.equal(batched[b], model.generate(p, 15)[0])


def test_probes_refuse_padded_batches():
    model = _model()
    caches = [KVCache(model.cfg) for _ in range(2)]
    for n, c in zip((3, 6), caches, strict=True):
        model(torch.randint(0, 40, (1, n)), cache=c)
    stacked = KVCache.stack(caches)
    with model.hook(lambda call: None), pytest.raises(ValueError, match="one at a time"):
        model(torch.randint(0, 40, (2, 1)), cache=stacked)


def test_decoding_reports_each_step_within_a_batch():
    """Progress within a batch: after every step, the number of tokens produced so far, up to where the
    last row stopped (here the budget: a random model emits no stop id within 5 steps of a wide vocab)."""
    torch.manual_seed(0)
    model = HeadprobeModel(Transformer(tiny_config(vocab_size=264)), ByteTokenizer(), "tiny")
    steps: list[int] = []
    out = model.decode_batch([torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5, 6]])], 5, [], on_step=steps.append)
    assert steps == [1, 2, 3, 4, 5] and [len(o) for o in out] == [5, 5]
    steps.clear()
    first = model.decode(torch.tensor([[1, 2, 3, 4]]), 5, [])
    cut = first.index(first[1]) + 1  # decoding stops after the first occurrence of the stop id
    single = model.decode_batch([torch.tensor([[1, 2, 3, 4]])], 5, [first[1]], on_step=steps.append)
    assert single == [first[:cut]] and steps == list(range(1, cut + 1))  # stopped there, and said so
