"""``echo`` and ``induction``: RazorAttention's scores (Tang et al., arXiv 2407.15891) on four copies of a random
token sequence (docs/metrics.md).

The input is the model's prompt start, then a sequence ``S`` of ``n = (length - len(start)) // 4`` token ids drawn
uniformly with replacement from the tokenizer's ordinary ids (no special token; the bytes of a byte-level model),
repeated four times. With ``m`` indexing the random tokens and ``a_m`` the attention of row ``m`` (over every key it
sees, the prompt start included), over the rows of the last three copies (``m >= n``)::

    echo(h)      = mean_m sum_{k >= 1, m - k n >= 0} a_m(m - k n)        attention to earlier copies of the token
    induction(h) = mean_m sum_{k >= 1, m - k n >= 0} a_m(m - k n + 1)    attention to the token after such a copy

as msModelSlim's implementation scores them (every earlier copy; accidental repeats inside a copy ignored). One
forward pass per sample; each row's probabilities of its at most six keys come from its log-sum-exp
(:func:`~.probs.key_probs`), never an ``L x L`` matrix. Sample ``i`` draws its sequence with seed ``(seed, i)``.
"""

from __future__ import annotations

import numpy as np
import torch

from headprobe.hooked.base import HookedModel
from headprobe.metrics.definitions import Options, Scored, head_grid, refused
from headprobe.metrics.probe import PassHook, Probe, Shared, score_sample, shared
from headprobe.metrics.probs import key_probs, row_lse
from headprobe.model.seam import AttentionCall
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.text.needles import NeedlePrompt

COPIES = 4
MIN_SEQUENCE = 2  # tokens per copy: a shorter one has no induction target


def ordinary_ids(tokenizer) -> np.ndarray:
    """The ids a random sequence draws from: a byte-level tokenizer's 256 bytes, else every id but the special ones."""
    if isinstance(tokenizer, ByteTokenizer):
        return np.arange(256)
    special = set(tokenizer.special_ids)
    return np.array([i for i in range(tokenizer.vocab_size) if i not in special])


def repeated_ids(model: HookedModel, length: int, seed: int, sample: int) -> tuple[list[int], int]:
    """The input of one sample (module docstring) and ``n``, the tokens per copy (``< MIN_SEQUENCE``: too short)."""
    start = list(model.prompt_start)
    n = (length - len(start)) // COPIES
    rng = np.random.default_rng([seed, sample])
    sequence = rng.choice(ordinary_ids(model.tokenizer), size=max(n, 0)).tolist()
    return start + sequence * COPIES, n


def copy_keys(rows: torch.Tensor, n: int, first: int, after: int) -> torch.Tensor:
    """``[rows, COPIES - 1]`` absolute key positions ``r - k n + after`` (``k = 1 .. COPIES - 1``) of each row
    ``r`` whose copy ``r - k n`` is a random token (at or after ``first``); ``-1`` otherwise."""
    k = torch.arange(1, COPIES)
    earlier = rows[:, None] - k[None, :] * n
    return torch.where(earlier >= first, earlier + after, torch.full_like(earlier, -1))


def razor(model: HookedModel, prompt: NeedlePrompt, options: Options, sample: int, after: int) -> Probe:
    """One sample's echo (``after = 0``) or induction (``after = 1``) score of every head (module docstring), on a
    random sequence of ``prompt.length`` tokens in all (the needle prompt itself is not read). Echo and induction
    of one sample share the pass and each row's log-sum-exp."""
    ids, n = repeated_ids(model, prompt.length, options.seed, sample)
    if n < MIN_SEQUENCE:
        return refused(f"{prompt.length} tokens hold no 4 copies of {MIN_SEQUENCE} or more random tokens")
    value = head_grid(model)
    hook = copy_hook(value, len(model.prompt_start), n, after)
    return Probe(((tuple(ids), hook),), lambda: Scored({"value": value}))


def copy_hook(value: np.ndarray, first: int, n: int, after: int) -> PassHook:
    """A hook writing into ``value [layers, max_heads]`` each head's attention, averaged over the rows of the copies
    after the first, to the earlier copies of the row's token (``after = 0``) or to the tokens after them
    (``after = 1``), for an input whose tokens from ``first`` on are :data:`COPIES` copies of ``n`` tokens."""
    rows = torch.arange(first + n, first + COPIES * n)
    keys = copy_keys(rows, n, first, after)

    def record(call: AttentionCall, memo: Shared) -> None:
        at = rows - call.query_start
        lse = shared(memo, ("lse", call.layer, first + n, n), lambda: row_lse(call, at))
        probs = key_probs(call, at, keys, lse)
        value[call.layer, : probs.shape[0]] = probs.sum(-1).mean(-1).numpy()

    return record


def copy_attention(model: HookedModel, ids: list[int], first: int, n: int, after: int) -> np.ndarray:
    """:func:`copy_hook`'s scores of ``ids`` (one forward pass)."""
    value = head_grid(model)
    score_sample(model, Probe(((tuple(ids), copy_hook(value, first, n, after)),), lambda: Scored({"value": value})))
    return value
