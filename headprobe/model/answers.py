"""How a model answers given prompts: exactly by greedy decoding, and the answers' teacher-forced loss.

The examples are ``(prompt ids, answer ids)`` pairs, e.g. a task probe's (:meth:`headprobe.text.probes.Probe.prompts`:
held-out retrieval at a chosen distance); the trainer logs these during training and ``headprobe study``
measures every finished run with them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from headprobe.model.transformer import Transformer

Pairs = Iterable[tuple[list[int], list[int]]]  # (prompt ids, answer ids) of each example


def exact_answers(model: Transformer, pairs: Pairs) -> list[bool]:
    """Whether greedy decoding from each prompt gives its answer's ids exactly (as many tokens as it has)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hits = []
    try:
        with torch.no_grad():
            for prompt, answer in pairs:
                out = model.generate(torch.tensor([prompt], device=device), len(answer))[0].tolist()
                hits.append(out == answer)
    finally:
        model.train(was_training)
    return hits


def exact_share(model: Transformer, pairs: Pairs) -> float:
    """The share of examples answered exactly (:func:`exact_answers`)."""
    hits = exact_answers(model, pairs)
    return sum(hits) / len(hits)


def answer_loss(model: Transformer, pairs: Pairs) -> float:
    """Mean cross-entropy (nats per answer token) of the answers given their prompts, each answer token
    predicted from the prompt and the answer's true tokens before it (teacher forcing)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for prompt, answer in pairs:
                seq = torch.tensor([prompt + answer], device=device)
                counted = torch.arange(seq.shape[1] - 1, device=device) >= len(prompt) - 1  # targets in the answer
                total += float(model(seq[:, :-1], targets=seq[:, 1:], loss_mask=counted[None]))
                count += len(answer)
    finally:
        model.train(was_training)
    return total / count
