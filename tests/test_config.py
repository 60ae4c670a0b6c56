import json

import pytest
import torch
from reference import param_count

from headprobe.model.config import AttentionConfig, ConfigError, ModelConfig
from headprobe.model.presets import list_presets, preset
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config


def meta_params(name: str) -> int:
    """Parameter count of the real model, built on the meta device (no memory)."""
    with torch.device("meta"):
        return param_count(Transformer(preset(name)))


@pytest.mark.parametrize("scale, lo, hi", [("toy", 1.2e6, 1.5e6), ("0.6b", 0.55e9, 0.65e9), ("3b", 2.8e9, 3.2e9)])
def test_preset_sizes(scale, lo, hi):
    names = list_presets(scale)
    assert len(names) == 5
    for name in names:
        assert lo <= meta_params(name) <= hi, name


@pytest.mark.parametrize("scale", ["toy", "0.6b", "3b"])
def test_grid_design(scale):
    cfgs = {n.split("-", 1)[1]: preset(n) for n in list_presets(scale)}
    symmetric = [c for m, c in cfgs.items() if m.startswith("d")]
    counts = [meta_params(c.name) for c in symmetric]
    assert max(counts) / min(counts) - 1 < 0.005
    budgets = {c.full.n_heads * c.full.qk_head_dim for c in symmetric}
    assert len(budgets) == 1
    budget = budgets.pop()
    for cfg in cfgs.values():
        assert cfg.swa == symmetric[0].swa  # the sliding layers keep one shape across the grid
        assert cfg.full.n_heads == budget // max(cfg.full.qk_head_dim, cfg.full.v_head_dim)
        assert cfg.full.window is None and cfg.swa.window is not None
        assert cfg.swa.rope_dim == cfg.swa.qk_head_dim  # sliding layers rotate every qk dim
        assert (cfg.d_model, cfg.n_layers, cfg.d_ff, cfg.vocab_size) == (
            symmetric[0].d_model,
            symmetric[0].n_layers,
            symmetric[0].d_ff,
            symmetric[0].vocab_size,
        )
    widths = sorted(c.full.qk_head_dim for c in symmetric)
    assert widths[2] == 4 * widths[0] and widths[1] == 2 * widths[0]
    asym = [c for m, c in cfgs.items() if m.startswith("k")]
    assert {(c.full.qk_head_dim, c.full.v_head_dim) for c in asym} == {
        (widths[2], widths[0]),
        (widths[0], widths[2]),
    }


def test_study_specific_values():
    for name in list_presets("0.6b") + list_presets("3b"):
        cfg = preset(name)
        assert cfg.swa.window == 512 and cfg.full.rope_dim == 64 and cfg.full_every == 4
    for name in list_presets("toy"):
        cfg = preset(name)
        # window 8: wider windows let a sliding layer take the copy circuit (docs/training.md); the built-in BPE
        assert cfg.swa.window == 8 and cfg.max_seq_len >= 4096 and cfg.vocab_size == 4096
    assert preset("0.6b-d128").full.n_heads == 16 and preset("0.6b-d512").full.n_heads == 4


@pytest.mark.parametrize(
    "att, match",
    [
        (dict(n_heads=4, qk_head_dim=8, v_head_dim=8, rope_dim=16), "exceeds qk_head_dim"),
        (dict(n_heads=4, qk_head_dim=8, v_head_dim=8, rope_dim=3), "even"),
        (dict(n_heads=6, qk_head_dim=8, v_head_dim=8, n_kv_heads=4), "not a multiple of n_kv_heads"),
        (dict(n_heads=4, qk_head_dim=8, v_head_dim=8, window=0), "window"),
        (dict(n_heads=0, qk_head_dim=8, v_head_dim=8), "n_heads"),
        (dict(n_heads=4, qk_head_dim=8, v_head_dim=-2), "v_head_dim"),
    ],
)
def test_attention_validation(att, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(swa=AttentionConfig(**{**att, "window": att.get("window", 4)}))


def test_model_validation():
    with pytest.raises(ConfigError, match=r"swa\.window is null"):
        tiny_config(swa=AttentionConfig(n_heads=2, qk_head_dim=8, v_head_dim=8))
    with pytest.raises(ConfigError, match=r"full\.window"):
        tiny_config(full=AttentionConfig(n_heads=2, qk_head_dim=8, v_head_dim=8, window=16))
    with pytest.raises(ConfigError, match="d_model"):
        tiny_config(d_model=0)
    with pytest.raises(ConfigError, match="unknown preset"):
        preset("0.6b-d1024")


def test_json_round_trip(tmp_path):
    cfg = preset("0.6b-k512v128")
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    (tmp_path / "config.json").write_text(cfg.to_json())
    assert ModelConfig.load(tmp_path) == cfg
    data = json.loads(cfg.to_json())
    assert data["full"] == {
        "n_heads": 4,
        "qk_head_dim": 512,
        "v_head_dim": 128,
        "n_kv_heads": None,
        "rope_dim": 64,
        "rope_theta": 10000.0,
        "window": None,
        "qk_norm": False,
        "qk_norm_scale": None,
    }


def test_json_errors(tmp_path):
    data = json.loads(preset("toy-d32").to_json())
    with pytest.raises(ConfigError, match="unknown config fields"):
        ModelConfig.from_dict({**data, "n_head": 3})
    with pytest.raises(ConfigError, match="unknown fields"):
        ModelConfig.from_dict({**data, "full": {**data["full"], "head_dim": 3}})
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ModelConfig.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.load(bad)


def test_overrides():
    cfg = preset("0.6b-d128", vocab_size=32_000)
    assert cfg.vocab_size == 32_000 and cfg.full == preset("0.6b-d128").full
