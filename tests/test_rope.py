"""RoPE against the complex-number formulation and its defining relative-position property."""

import pytest
import torch
from reference import complex_rope

from headprobe.model.rope import Rotary


@pytest.mark.parametrize("rope_dim, dim", [(8, 8), (4, 16), (64, 128), (0, 8)])
def test_matches_complex_formulation(rope_dim, dim):
    x = torch.randn(2, 11, 3, dim, dtype=torch.float64)
    got = Rotary(rope_dim, 10_000.0)(x, offset=5)
    want = x if rope_dim == 0 else complex_rope(x, torch.arange(5, 16, dtype=torch.float64), rope_dim, 10_000.0)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    if rope_dim < dim:
        assert torch.equal(got[..., rope_dim:], x[..., rope_dim:])  # partial RoPE leaves the rest alone


def test_scores_depend_only_on_relative_position():
    rot = Rotary(16, 500.0)
    q = torch.randn(1, 1, 1, 24, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 24, dtype=torch.float64)

    def score(p, s):
        return float((rot(q, offset=p) * rot(k, offset=s)).sum())

    assert score(7, 3) == pytest.approx(score(1007, 1003), abs=1e-9)
    assert score(7, 3) != pytest.approx(score(8, 3), abs=1e-6)


def test_offset_equals_slice_of_longer_sequence_and_large_positions():
    rot = Rotary(8, 10_000.0)
    x = torch.randn(1, 300, 2, 8, dtype=torch.float64)
    torch.testing.assert_close(rot(x)[:, 200:], rot(x[:, 200:], offset=200), atol=1e-12, rtol=0)
    far = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    want = complex_rope(far, torch.tensor([262_140.0, 262_141.0], dtype=torch.float64), 8, 10_000.0)
    torch.testing.assert_close(rot(far, offset=262_140), want, atol=1e-9, rtol=0)
