"""The public API as the README shows it: `import headprobe as hp`."""

from __future__ import annotations

import pytest
import torch
from reference import dense_entropy_per_head


def test_the_readme_example(tmp_path):
    import headprobe as hp

    net = hp.model.Transformer(hp.model.preset("toy-k64v16"))  # full-attention heads: 2 x (qk 64, v 16)
    logits, cache = net.run_with_cache(torch.randint(0, 256, (1, 128)))
    assert logits.shape == (1, 128, 4096)  # the toy presets read the 4,096-id toy BPE
    assert cache["blocks.3.attn.hook_rot_q"].shape == (1, 128, 2, 64)  # [batch, pos, heads, qk_dim] after RoPE
    assert cache["blocks.3.attn.hook_z"].shape == (1, 128, 2, 16)  # [batch, pos, heads, v_dim]
    new_tokens = net.generate(torch.randint(0, 256, (1, 32)), max_new_tokens=16)
    assert new_tokens.shape[0] == 1 and 1 <= new_tokens.shape[1] <= 16

    hp.model.save_checkpoint(net, tmp_path / "toy")
    model = hp.load_model(tmp_path / "toy")
    assert isinstance(model, hp.HookedModel) and model.layers[3].qk_dim == 64
    settings = hp.AnalyzeSettings(metrics=["entropy"], lengths=[96], samples=1)
    report = hp.analyze([tmp_path / "toy"], tmp_path / "results", settings)
    entropy = report.table("entropy")
    assert set(entropy.model) == {"toy"} and len(entropy) == 2 * 4 + 2 * 2  # sliding 2 x 4 heads, full 2 x 2
    from headprobe.text.haystack import text_inputs

    ids = text_inputs(model.tokenizer, 96, 1, start=model.prompt_start)
    want = dense_entropy_per_head(net, ids)
    for r in entropy.itertuples():
        assert r.value == pytest.approx(float(want[r.layer][r.head]), abs=1e-5)
    assert hp.read_table(tmp_path / "results" / "toy" / "entropy.parquet").meta.settings["lengths"] == [96]


def test_unknown_names_are_refused():
    import headprobe as hp

    with pytest.raises(AttributeError, match="no attribute 'anlyze'"):
        hp.anlyze  # noqa: B018
