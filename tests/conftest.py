"""Shared test helpers: tiny configurations and an independent dense attention reference."""

from __future__ import annotations

import math

import pytest
import torch

from headprobe.model.config import AttentionConfig, ModelConfig


def tiny_config(**overrides) -> ModelConfig:
    """A 4-layer model (layer 3 full attention) small enough for float64 references."""
    base = dict(
        vocab_size=40,
        d_model=32,
        n_layers=4,
        d_ff=48,
        swa=AttentionConfig(n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=2, rope_dim=8, window=5),
        full=AttentionConfig(n_heads=2, qk_head_dim=16, v_head_dim=4, rope_dim=8, rope_theta=500.0),
        max_seq_len=64,
        init_std=0.2,
    )
    base.update(overrides)
    return ModelConfig(**base)


def loop_attention(q, k, v, window, scale):
    """Attention written one query at a time from the convention's words, in float64.

    Query i of Lq sits at key position Lk - Lq + i and sees the keys j with
    position - window < j <= position (all j <= position when window is None).
    q: [B, H, Lq, D], k: [B, Hkv, Lk, D], v: [B, Hkv, Lk, Dv].
    """
    b, h, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hkv)
            for i in range(lq):
                pos = lk - lq + i
                first = 0 if window is None else max(0, pos - window + 1)
                keys = list(range(first, pos + 1))
                s = torch.tensor(
                    [float(q[bi, hi, i].double() @ k[bi, kv, j].double()) * scale for j in keys],
                    dtype=torch.float64,
                )
                p = torch.exp(s - s.max())
                p = p / p.sum()
                out[bi, hi, i] = sum(p[n] * v[bi, kv, j].double() for n, j in enumerate(keys))
    return out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _corpus_cache(tmp_path_factory):
    """One cache folder for the built-in corpus across the session (it is generated on first use)."""
    import os

    folder = tmp_path_factory.mktemp("headprobe-cache")
    old = os.environ.get("HEADPROBE_CACHE")
    os.environ["HEADPROBE_CACHE"] = str(folder)
    yield folder
    if old is None:
        os.environ.pop("HEADPROBE_CACHE", None)
    else:
        os.environ["HEADPROBE_CACHE"] = old


def default_scale(dim: int) -> float:
    return 1 / math.sqrt(dim)
