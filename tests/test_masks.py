import pytest
import torch

from headprobe.model.masks import CausalMask


def test_window_three_hand_worked():
    # 2 queries at key positions 3 and 4 of 5 keys; window 3 => position 3 sees 1,2,3; position 4 sees 2,3,4
    expected = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(CausalMask(3).dense(2, 5), expected)


def test_full_causal_hand_worked():
    expected = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(CausalMask(None).dense(2, 3), expected)


def test_window_one_sees_only_itself():
    assert torch.equal(CausalMask(1).dense(4, 4), torch.eye(4, dtype=torch.bool))


def test_key_range_and_flash_window():
    assert CausalMask(512).key_range(1000) == (489, 1001)  # 512 keys including 1000
    assert CausalMask(512).key_range(3) == (0, 4)
    assert CausalMask(512).flash_window_size() == (511, 0)
    assert CausalMask(None).flash_window_size() == (-1, -1)


def test_every_row_sees_exactly_window_keys():
    m = CausalMask(7).dense(50, 50)
    counts = m.sum(-1)
    assert counts.tolist() == [min(i + 1, 7) for i in range(50)]


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_window(bad):
    with pytest.raises(ValueError, match="window"):
        CausalMask(bad)


def test_queries_longer_than_keys_rejected():
    with pytest.raises(ValueError, match="q_len"):
        CausalMask(None).dense(5, 3)
