"""Multiple-choice scoring by log-likelihood, as lm-evaluation-harness scores it.

The score of a choice is the summed log-probability of its continuation's tokens given the context.
``acc`` picks the largest sum; ``acc_norm`` divides each sum by the continuation's length in characters
first (lm-eval's length normalisation).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from headprobe.core.progress import Progress, Silent
from headprobe.evals.shortctx.items import Item, ShortCtxError
from headprobe.hooked import HookedModel


def token_logprobs(model: HookedModel, ids: list[int]) -> torch.Tensor:
    """Log-softmax over the vocabulary for every position of ``ids`` (``[len, vocab]``)."""
    return torch.log_softmax(model.logits(torch.tensor([ids]))[0].double(), dim=-1)


def _pair_ids(model: HookedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation token ids, tokenised separately (as lm-eval does)."""
    tok = model.tokenizer
    ctx = model.encode_prompt(context)
    cont = tok.encode(continuation)
    if not cont:
        raise ShortCtxError(f"continuation {continuation!r} has no tokens")
    if not ctx:  # lm-eval: start from the end-of-text token when there is no context
        ctx = [tok.eos_id if tok.eos_id is not None else cont[0]]
    return ctx, cont


LOGIT_BUDGET = 1 << 27  # float32 logits held at once by a batch (batch x length x vocab), 512 MiB


def loglikelihoods(
    model: HookedModel, pairs: list[tuple[str, str]], batch_size: int = 16, progress: Progress | None = None
) -> list[tuple[float, bool]]:
    """``(sum of log p(continuation tokens | context), whether greedy decoding would produce them)`` for
    each ``(context, continuation)`` pair.

    Context and continuation are tokenised separately and concatenated, as lm-eval does, so the
    continuation's tokens are exactly those scored. Sequences of similar length run together, padded on
    the right: attention is causal, so padding after a sequence never changes its logits. A batch holds
    at most ``batch_size`` sequences and ``LOGIT_BUDGET`` logits.
    """
    progress = progress or Silent()
    encoded = [_pair_ids(model, c, x) for c, x in pairs]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]) - len(encoded[i][1]))
    vocab = None
    out: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    progress.start(len(encoded), "loglikelihood")
    start = 0
    while start < len(order):
        longest = len(encoded[order[start]][0]) + len(encoded[order[start]][1])
        fits = max(1, LOGIT_BUDGET // (longest * vocab)) if vocab else 1
        chunk = order[start : start + min(batch_size, fits)]
        ids = torch.zeros(len(chunk), longest, dtype=torch.long)
        for row, i in enumerate(chunk):
            seq = encoded[i][0] + encoded[i][1]
            ids[row, : len(seq)] = torch.tensor(seq)
        logits = model.logits(ids)  # [rows, longest, vocab]
        vocab = logits.shape[-1]
        for row, i in enumerate(chunk):
            ctx, cont = encoded[i]
            picked = torch.log_softmax(logits[row, len(ctx) - 1 : len(ctx) - 1 + len(cont)].double(), dim=-1)
            target = torch.tensor(cont, device=picked.device)
            out[i] = (float(picked.gather(-1, target[:, None]).sum()), bool((picked.argmax(-1) == target).all()))
        progress.advance(len(chunk))
        start += len(chunk)
    return out


def loglikelihood(model: HookedModel, context: str, continuation: str) -> tuple[float, bool]:
    """One pair's :func:`loglikelihoods`."""
    return loglikelihoods(model, [(context, continuation)])[0]


def evaluate_items(
    model: HookedModel, items: Iterable[Item], progress: Progress | None = None, batch_size: int = 16
) -> dict[str, Any]:
    """``acc`` and ``acc_norm`` (0-1) over ``items``, with per-item predictions."""
    items = list(items)
    if not items:
        raise ShortCtxError("no items to evaluate")
    scored = iter(loglikelihoods(model, [p for item in items for p in item.pairs], batch_size, progress))
    correct = correct_norm = 0
    rows = []
    for item in items:
        sums = [next(scored)[0] for _ in item.pairs]
        norm = [s / max(1, len(x)) for s, (_, x) in zip(sums, item.pairs, strict=True)]
        pred, pred_norm = max(range(len(sums)), key=sums.__getitem__), max(range(len(norm)), key=norm.__getitem__)
        correct += pred == item.label
        correct_norm += pred_norm == item.label
        rows.append({"label": item.label, "pred": pred, "pred_norm": pred_norm, "loglikelihoods": sums})
    return {"acc": correct / len(items), "acc_norm": correct_norm / len(items), "n": len(items), "items": rows}
