"""``query_focus``: QRHead's query-focused retrieval score (Zhang et al., arXiv 2506.09944; their code's
``attn_retriever.py``), with the needle sentence as the one gold document (docs/metrics.md).

The question rows ``Q`` run from the start of the question part (the needle's ``prompt``: ``"\\nBased on the content
of the book, Question: ..."``) to the prompt's end, the chat template's closing and answer prefix included, as
QRHead's run from its instruction through the chat suffix. ``D`` is the needle sentence's tokens and the needle reach
after them. Per head and key ``j`` of ``D``::

    c(j)  = mean_{r in Q} a_r(j)          the question's attention to the needle
    c0(j) = the same with the question replaced by "N/A" (the null question; the keys before it are unchanged)
    c~(j) = c(j) - c0(j)
    theta = mean_D c~ - 2 std_D c~        (unbiased std; no cut when |D| = 1)
    query_focus(h) = sum_{j in D, c~(j) > theta} c~(j)

Two forward passes per sample: the prompt, and the prompt with the null question. No answer is needed. A sample
whose prompt holds no question (a needle file whose ``prompt`` has no ``{question}``, or an empty question) has no
number; nor one whose null question changes the tokens before the question.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from headprobe.hooked.base import HookedModel
from headprobe.metrics.definitions import Options, Scored, head_grid, refused, rows_hook
from headprobe.metrics.locos import NO_SENTENCE
from headprobe.metrics.probe import PassHook, Probe
from headprobe.metrics.probs import key_positions
from headprobe.metrics.retrieval import Span, forced_prompt
from headprobe.model.seam import AttentionCall
from headprobe.text.needles import NeedlePrompt

NULL_QUESTION = "N/A"


def focus(c: Tensor, c0: Tensor) -> Tensor:
    """``[heads]`` QRHead's calibrated score from the question's mean attention to each document key with the real
    question ``c`` and the null one ``c0`` (``[heads, keys]``): the sum of ``c - c0`` over the keys above
    ``mean - 2 std`` of it."""
    d = c - c0
    if d.shape[-1] < 2:
        return d.sum(-1)
    theta = d.mean(-1, keepdim=True) - 2 * d.std(-1, keepdim=True)
    return torch.where(d > theta, d, torch.zeros_like(d)).sum(-1)


def null_prompt_ids(model: HookedModel, prompt: NeedlePrompt) -> list[int]:
    """``prompt``'s ids with its question replaced by :data:`NULL_QUESTION` (its text tokenised again, behind the same
    prompt start)."""
    start, end = prompt.question
    start_ids = prompt.ids[: len(prompt.ids) - len(model.tokenizer.encode(prompt.text))]
    return [*start_ids, *model.tokenizer.encode(prompt.text[:start] + NULL_QUESTION + prompt.text[end:])]


def question_hook(out: np.ndarray, rows: range, doc: tuple[int, int]) -> PassHook:
    """A hook writing into ``out [layers, max_heads, doc keys]`` each head's attention to the keys ``doc`` averaged
    over the query ``rows``."""

    def seen(call: AttentionCall, found: np.ndarray, probs: Tensor) -> None:
        keys = key_positions(call).cpu()
        on = (keys >= doc[0]) & (keys < doc[1])
        out[call.layer, : probs.shape[0]] = probs[:, :, on].mean(1).numpy()

    return rows_hook(rows, seen)


NO_QUESTION = "the prompt holds no question (the needle's prompt has no {question}, or it is empty)"


def query_focus(model: HookedModel, prompt: NeedlePrompt, options: Options) -> Probe:
    """One sample's ``query_focus`` of every head (module docstring): the question rows read from the pass over the
    prompt and its forced answer (the prompt's rows are the prompt's alone, causally: shared with the forced
    definitions), and one pass over the null prompt."""
    if prompt.question[0] < 0 or prompt.query_start < 0:
        return refused(NO_QUESTION)
    if prompt.sentence[0] < 0:
        return refused(NO_SENTENCE)
    null = null_prompt_ids(model, prompt)
    if null[: prompt.query_start] != prompt.ids[: prompt.query_start]:
        return refused("the null question changes the tokens before the question")
    doc = (prompt.sentence[0], min(prompt.sentence[1] + options.needle_reach, prompt.query_start))
    shape = (len(model.layers), max(info.n_heads for info in model.layers), doc[1] - doc[0])
    c, c0 = np.full(shape, np.nan), np.full(shape, np.nan)
    forced = forced_prompt(model, prompt, Span.EXACT)
    runs = (
        (tuple(forced.ids), question_hook(c, range(prompt.query_start, prompt.length), doc)),
        (tuple(null), question_hook(c0, range(prompt.query_start, len(null)), doc)),
    )

    def score() -> Scored:
        value = head_grid(model)
        for info in model.layers:
            h = info.n_heads
            value[info.index, :h] = focus(torch.from_numpy(c[info.index, :h]), torch.from_numpy(c0[info.index, :h]))
        return Scored({"value": value})

    return Probe(runs, score)
