"""The models the teacher-forced tests share (the forced retrieval scores, the needle margin): hand-built ones
whose scores are known exactly, worked out by hand in the tests, and a small random one they compare to dense
float64 references.

* :class:`InductionModel` two layers (full, then sliding of window 6), an induction head and a uniform head each.
* :class:`ValueInductionModel` the same heads writing their keys' tokens: each value is the one-hot of its token,
  the output projection and unembedding identities, so a key's logit contribution to token ``y`` is ``[token = y]``.
* :func:`hand_prompt` an 11-byte needle prompt whose answer is forced behind its final space.
* :data:`GQA_SLIDING` / :func:`gqa_sliding_model` a tiny random model whose sliding layers (window 128) have 4
  query heads on 2 kv heads: at depth 100 of a 300-byte prompt the window holds part of the needle.
"""

from __future__ import annotations

import torch

from headprobe.hooked import HeadprobeModel, HookedModel
from headprobe.model.config import AttentionConfig, LayerInfo, LayerType
from headprobe.model.seam import AttentionCall
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.testing import tiny_config
from headprobe.text.needles import Needle, NeedlePrompt


class InductionModel(HookedModel):
    """A hand-built byte-level model of two layers, each with an induction head (head 0) and a uniform head
    (head 1); layer 1 is a sliding layer of window 6. Head 0's query is the one-hot of the current token and
    its key at ``j`` is 50 x the one-hot of the token before ``j``, so row ``i`` attends to the positions just
    after earlier occurrences of its token; head 1's query is zero, so it spreads evenly over the keys it sees."""

    def __init__(self) -> None:
        self.name, self.tokenizer, self.device, self.prompt_start = "hand", ByteTokenizer(), torch.device("cpu"), []
        self.layers = [LayerInfo(0, LayerType.FULL, 2, 2, 264, 264, None),
                       LayerInfo(1, LayerType.SLIDING, 2, 2, 264, 264, 6)]  # fmt: skip
        self.max_positions = 64

    def run(self, input_ids, hook=None, residual=None):
        current = torch.nn.functional.one_hot(input_ids[0], 264).double()  # [L, 264]
        before = torch.cat([torch.zeros(1, 264, dtype=torch.float64), current[:-1]]) * 50.0
        q = torch.stack([current, torch.zeros_like(current)])[None]  # [1, 2 heads, L, 264]
        k = torch.stack([before, before])[None]
        v = torch.stack([current, current])[None]  # each key's value: its token
        for info in self.layers:
            hook(AttentionCall(info.index, info.layer_type, q, k, info.window, 1.0, 0, v=v))


class ValueInductionModel(InductionModel):
    """:class:`InductionModel` whose heads write their values (the one-hot of each key's token) straight into
    the residual stream, read by an identity unembedding: ``W_U[y] . W_O[h] v_j = [token_j = y]``."""

    def output_projection(self, layer):
        return torch.cat([torch.eye(264, dtype=torch.float64)] * 2, dim=1)  # [d_model, heads * v_dim]

    def unembedding(self):
        return torch.eye(264, dtype=torch.float64)


def hand_prompt() -> NeedlePrompt:
    """``"pq 4729.rs "``: the answer ``4729`` at positions 3-6; the text ends in a space, so the answer is forced
    behind it with no space of its own: rows 10 (``" "``), 11 (``4``), 12 (``7``), 13 (``2``) produce ``4, 7, 2,
    9``. Each of those tokens occurs once before, right before the span token that comes next."""
    text = "pq 4729.rs "
    needle = Needle("pq ", "4729", ".", "the code?")
    return NeedlePrompt(list(text.encode()), 3, 7, needle, 50.0, "hand", text)


GQA_SLIDING = tiny_config(
    vocab_size=264,
    swa=AttentionConfig(n_heads=4, qk_head_dim=8, v_head_dim=8, n_kv_heads=2, rope_dim=8, window=128),
)


def gqa_sliding_model() -> HeadprobeModel:
    """:data:`GQA_SLIDING` with the weights of seed 0."""
    torch.manual_seed(0)
    return HeadprobeModel(Transformer(GQA_SLIDING), ByteTokenizer(), "tiny")
