import math

import pytest
import torch

from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config
from trainer.optim import Schedule, build_optimizer


def test_cosine_hand_worked():
    s = Schedule("cosine", lr=1.0, total_steps=110, warmup_steps=10, min_lr_ratio=0.1)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0)  # linear warmup to the peak
    assert s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway: 0.55
    assert s(110) == pytest.approx(0.1) and s(500) == pytest.approx(0.1)


def test_wsd_hand_worked():
    s = Schedule("wsd", lr=2.0, total_steps=100, warmup_steps=0, min_lr_ratio=0.0, decay_fraction=0.2)
    assert [s(i) for i in (0, 50, 79)] == [2.0, 2.0, 2.0]
    assert s(80) == pytest.approx(2.0 - 2.0 / 20)  # first decay step
    assert s(99) == pytest.approx(0.0)


def test_schedule_validation():
    with pytest.raises(ValueError, match="unknown schedule"):
        Schedule("linear", 1.0, 10)  # type: ignore[arg-type]


def test_weight_decay_only_on_matrices_and_frozen_excluded():
    model = Transformer(tiny_config())
    model.blocks[0].attn.q_proj.weight.requires_grad_(False)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    assert id(model.blocks[0].attn.q_proj.weight) not in ids
    assert len(ids) == sum(1 for p in model.parameters() if p.requires_grad)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="everything is frozen"):
        build_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    assert torch.is_tensor(decay["params"][0])
