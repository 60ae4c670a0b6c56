"""The one greedy loop (issue 30: Transformer.generate and HookedModel.decode / decode_batch shared none)."""

from __future__ import annotations

import torch

from headprobe.model.decoding import greedy


def test_rows_end_at_their_first_stop_token_and_the_loop_at_the_budget():
    # row 0 counts up from 1 (stop 3 reached at its third token); row 1 counts up from 5 (never stops)
    steps: list[list[int]] = []

    def step(ids: torch.Tensor) -> torch.Tensor:
        steps.append(ids[:, 0].tolist())
        return ids[:, 0] + 1

    told: list[int] = []
    rows = greedy(torch.tensor([1, 5]), step, max_new_tokens=5, stop_ids=[3], on_step=told.append)
    assert rows == [[1, 2, 3], [5, 6, 7, 8, 9]]
    assert len(steps) == 4 and told == [1, 2, 3, 4, 5]  # no step after the budget's last token


def test_the_loop_ends_when_every_row_has_stopped():
    rows = greedy(torch.tensor([7, 2]), lambda ids: torch.full_like(ids[:, 0], 7), 10, stop_ids=[7])
    assert rows == [[7], [2, 7]]


def test_generate_and_decode_give_the_same_tokens_through_the_one_loop():
    from headprobe.hooked.ours import HeadprobeModel
    from headprobe.model.tokenizer import ByteTokenizer
    from headprobe.model.transformer import Transformer
    from headprobe.testing import tiny_config

    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=264, max_seq_len=128)).eval()
    prompt = torch.randint(0, 264, (1, 40))
    free = model.generate(prompt, 12)[0].tolist()
    assert free == HeadprobeModel(model, ByteTokenizer(), "tiny").decode(prompt, 12)  # no stop: 12 tokens each
    stop = [free[3]]  # a token the continuation reaches by its fourth step
    ours = model.generate(prompt, 12, stop_ids=stop)[0].tolist()
    hooked = HeadprobeModel(model, ByteTokenizer(), "tiny").decode(prompt, 12, stop_ids=stop)
    assert ours == hooked == free[: free.index(stop[0]) + 1]
