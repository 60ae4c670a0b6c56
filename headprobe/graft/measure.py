"""What ``graft`` measures of each model (the base, the donor and every hybrid), as tidy rows.

* From the analyze needles (:func:`headprobe.analysis.items.needle_prompts`: the same prompts for every model
  of a run), per length, through :func:`headprobe.metrics.retrieval.score_prompts` (one greedy decoding and
  one teacher-forced pass per prompt):

  - ``needle_accuracy``: the share of prompts answered (ROUGE-1 recall > 0.5, Wu et al.'s rule), 0-1;
  - ``needle_prefix``: the share whose answer begins with the needle's answer (leading spaces aside), 0-1: the
    toys' greedy answers run on past their code with no space (``36103032 4303...``), a word ROUGE does not
    match, so for them this is the accuracy;
  - ``retrieval_heads``: heads whose Wu score is >= 0.1 (NaN when no prompt was answered: no score);
  - ``forced_retrieval_heads``: heads whose teacher-forced score is >= 0.1;
  - ``reading_heads``: heads whose forced mass is >= :data:`~headprobe.metrics.retrieval.READING_MASS`;
  - ``top_forced_mass``: the largest forced mass of any head (0-1).

* The held-out loss (:func:`heldout_losses`, length 0 in the table): ``eval_loss``, ``eval_loss_local``,
  ``eval_loss_retrieval`` on :func:`headprobe.text.heldout.eval_rows` in the model's own tokenizer (nats per
  target token), one row at a time through the model's logits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from headprobe.hooked.base import HookedModel
from headprobe.metrics.retrieval import READING_MASS, score_prompts
from headprobe.metrics.summaries import RETRIEVAL_THRESHOLD
from headprobe.text.heldout import eval_rows
from headprobe.text.needles import NeedlePrompt

Measure = tuple[str, int, float, int]  # metric, length (0: not a length's), value, n (prompts or targets)


def needle_measures(
    model: HookedModel, prompts: Sequence[NeedlePrompt], length: int, max_new_tokens: int, reach: int
) -> Iterator[Measure]:
    """The needle rows of the module docstring for ``prompts`` (all of one ``length``)."""
    scores = score_prompts(model, prompts, max_new_tokens, reach=reach)
    heads, n = scores.heads, len(prompts)
    answered = float(scores.samples["kept"].astype(bool).mean()) if n else math.nan
    yield "needle_accuracy", length, answered, n
    first = [r.lstrip().startswith(p.needle.answer) for r, p in zip(scores.samples["response"], prompts, strict=True)]
    yield "needle_prefix", length, sum(first) / n if n else math.nan, n
    wu = math.nan if heads["value"].isna().all() else float((heads["value"] >= RETRIEVAL_THRESHOLD).sum())
    yield "retrieval_heads", length, wu, n
    yield "forced_retrieval_heads", length, float((heads["forced_value"] >= RETRIEVAL_THRESHOLD).sum()), n
    yield "reading_heads", length, float((heads["forced_mass"] >= READING_MASS).sum()), n
    yield "top_forced_mass", length, float(heads["forced_mass"].max()), n


def heldout_losses(model: HookedModel) -> dict[str, tuple[float, int]]:
    """``eval_loss`` and ``eval_loss_<split>`` of ``model`` on the held-out rows in its tokenizer, each with its
    number of target tokens: every row behind the model's prompt start, its targets' next-token cross-entropy
    from the model's logits, summed per split, over the split's targets (nats per target token)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    start = list(model.prompt_start)
    for row in eval_rows(model.tokenizer):
        ids = torch.tensor([[*start, *row.ids]])
        targets = torch.tensor([False] * len(start) + list(row.targets))
        where = targets.nonzero()[:, 0]
        where = where[where > 0]
        if not len(where):
            continue
        logits = model.logits(ids)[0].double()  # [tokens, vocab]
        losses = torch.nn.functional.cross_entropy(logits[where - 1], ids[0, where].to(logits.device), reduction="sum")
        sums[row.split] = sums.get(row.split, 0.0) + float(losses)
        counts[row.split] = counts.get(row.split, 0) + len(where)
    total = sum(counts.values())
    out = {"eval_loss": (sum(sums.values()) / total if total else math.nan, total)}
    return out | {f"eval_loss_{split}": (sums[split] / counts[split], counts[split]) for split in sums}
