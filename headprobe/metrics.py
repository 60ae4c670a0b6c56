"""Per-head and per-layer metrics as tidy tables (definitions: docs/metrics.md).

Every function returns a ``pandas.DataFrame`` with one row per layer x head (per layer for effective
rank) and the columns ``layer`` (0-based), ``head``, ``layer_type`` and ``value`` plus metric-specific
ones. Attention statistics come from :func:`headprobe.stats.attention_stats` at the model's probe
seam, so no ``L x L`` matrix is ever built.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from headprobe.model.seam import AttentionCall
from headprobe.probe import ProbedModel
from headprobe.stats import attention_stats
from headprobe.text.needles import NEEDLES, Needle, NeedlePrompt, needle_prompt

# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------
_ROWS = re.compile(r"^(all|last:(\d+)|stride:(\d+))$")


def parse_rows(spec: str | None, length: int) -> Tensor | None:
    """``all`` (or ``None``) | ``last:N`` (the last N positions) | ``stride:N`` (every N-th position,
    ending at the last) -> query indices, or ``None`` for all."""
    if spec is None or spec == "all":
        return None
    m = _ROWS.match(spec.strip())
    if not m:
        raise ValueError(f"--rows {spec!r}: expected all, last:N or stride:N (N a positive integer)")
    n = int(m.group(2) or m.group(3))
    if n < 1:
        raise ValueError(f"--rows {spec!r}: N must be at least 1")
    if m.group(2):
        return torch.arange(max(0, length - n), length)
    return torch.arange(length - 1, -1, -n).flip(0)


# ---------------------------------------------------------------------------------------------
# Attention entropy and token reordering (one streaming pass serves both)
# ---------------------------------------------------------------------------------------------
def kendall_reordering(topk_idx: Tensor) -> Tensor:
    """Normalised Kendall distance between attention order and recency order, per row.

    ``topk_idx [..., k]`` holds key positions sorted by attention probability (largest first), ``-1``
    for missing entries. A pair ranked ``a`` before ``b`` by attention disagrees with recency when ``a``
    is older (smaller position) than ``b``. Returns the fraction of disagreeing pairs (NaN for rows
    with fewer than two keys).
    """
    valid = topk_idx >= 0
    n = valid.sum(-1)
    older = topk_idx[..., :, None] < topk_idx[..., None, :]  # [..., a, b]: a is older than b
    k = topk_idx.shape[-1]
    later = torch.triu(torch.ones(k, k, dtype=torch.bool, device=topk_idx.device), diagonal=1)  # b after a
    both = valid[..., :, None] & valid[..., None, :]
    discordant = (older & later & both).sum((-1, -2)).double()
    pairs = (n * (n - 1) / 2).double()
    return torch.where(n >= 2, discordant / pairs.clamp(min=1), torch.full_like(pairs, math.nan))


class HeadAccumulator:
    """Running per-(layer, head) sums of row statistics over samples."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, str], Tensor] = {}
        self.counts: dict[tuple[int, str], Tensor] = {}

    def add(self, layer: int, name: str, values: Tensor) -> None:
        """``values [batch, heads, rows]``; NaNs are skipped."""
        ok = ~torch.isnan(values)
        total = torch.where(ok, values, torch.zeros_like(values)).double().sum((0, 2)).cpu()
        count = ok.sum((0, 2)).cpu()
        key = (layer, name)
        self.sums[key] = self.sums.get(key, 0) + total
        self.counts[key] = self.counts.get(key, 0) + count

    def mean(self, layer: int, name: str) -> np.ndarray:
        s, c = self.sums[(layer, name)], self.counts[(layer, name)]
        return (s / c.clamp(min=1)).where(c > 0, torch.tensor(math.nan, dtype=torch.float64)).numpy()


def _head_frame(model: ProbedModel, acc: HeadAccumulator, value: str, extra: dict[str, str]) -> pd.DataFrame:
    records = []
    for info in model.layers:
        columns = {name: acc.mean(info.index, src) for name, src in {"value": value, **extra}.items()}
        for head in range(info.n_heads):
            records.append(
                {"layer": info.index, "head": head, "layer_type": info.layer_type}
                | {name: float(col[head]) for name, col in columns.items()}
            )
    return pd.DataFrame.from_records(records)


_ENTROPY_EXTRA = {"norm_value": "norm_entropy", "max_prob": "max_prob", "mean_distance": "mean_distance"}


class StreamingAnalysis:
    """One forward pass per input feeds every requested statistic; nothing ``L x L`` is kept.

    Args:
        model: the model to probe.
        rows: query indices to analyse (``None`` = all).
        k: top-k size for token reordering (0 = skip reordering).
        heads: collect per-head attention statistics.
        residual: accumulate residual-stream Gram matrices for effective rank (into ``grams``, which
            may be shared between analyses to pool inputs).
    """

    def __init__(
        self,
        model: ProbedModel,
        rows: Tensor | None = None,
        k: int = 16,
        heads: bool = True,
        residual: bool = False,
        grams: dict[int, GramAccumulator] | None = None,
    ) -> None:
        self.model, self.rows, self.k = model, rows, k
        self.heads, self.residual = heads, residual
        self.acc = HeadAccumulator()
        self.grams = grams if grams is not None else {}

    def add(self, input_ids: Tensor) -> StreamingAnalysis:
        rows, k, acc = self.rows, self.k, self.acc

        def probe(call: AttentionCall) -> None:
            st = attention_stats(call.q, call.k, window=call.window, scale=call.scale, rows=rows, topk=k)
            for name in ("entropy", "norm_entropy", "max_prob", "mean_distance"):
                acc.add(call.layer, name, getattr(st, name))
            if k:
                acc.add(call.layer, "reordering", kendall_reordering(st.topk_idx))

        def residual(layer: int, x: Tensor) -> None:
            x = x if rows is None else x[:, rows.to(x.device)]
            self.grams.setdefault(layer, GramAccumulator()).add(x)

        self.model.run(input_ids, probe=probe if self.heads else None, residual=residual if self.residual else None)
        return self

    def entropy(self) -> pd.DataFrame:
        return _head_frame(self.model, self.acc, "entropy", _ENTROPY_EXTRA)

    def reordering(self) -> pd.DataFrame:
        return _head_frame(self.model, self.acc, "reordering", {})

    def erank(self) -> pd.DataFrame:
        return erank_frame(self.model, self.grams)


def head_statistics(
    model: ProbedModel, input_ids: Tensor, rows: Tensor | None = None, k: int = 16
) -> dict[str, pd.DataFrame]:
    """Entropy and token reordering from one pass: ``{"entropy": ..., "reordering": ...}``."""
    run = StreamingAnalysis(model, rows, k).add(input_ids)
    return {"entropy": run.entropy(), "reordering": run.reordering()}


def attention_entropy(model: ProbedModel, input_ids: Tensor, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean attention entropy (nats) per head over the analysed rows of every input; ``norm_value`` is the
    mean of entropy / log(visible keys). Also ``max_prob`` and ``mean_distance`` means."""
    return StreamingAnalysis(model, rows, k=0).add(input_ids).entropy()


def token_reordering(model: ProbedModel, input_ids: Tensor, k: int = 16, rows: Tensor | None = None) -> pd.DataFrame:
    """Mean normalised Kendall distance between each row's top-``k`` attention order and recency order
    (0 = follows recency, 0.5 = unrelated, 1 = reversed)."""
    if k < 2:
        raise ValueError("token reordering needs k >= 2")
    return StreamingAnalysis(model, rows, k).add(input_ids).reordering()


# ---------------------------------------------------------------------------------------------
# Effective rank
# ---------------------------------------------------------------------------------------------
def _erank_from_gram(gram: Tensor) -> float:
    eig = torch.linalg.eigvalsh(gram.double()).clamp(min=0)
    sigma = eig.sqrt()
    total = sigma.sum()
    if total <= 0:
        return 0.0
    p = sigma / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def effective_rank(x: Tensor, center: bool = True) -> float:
    """Roy & Vetterli's effective rank of ``x [N, D]``: ``exp(H(p))`` with ``p = sigma / sum(sigma)``,
    from the ``D x D`` Gram matrix (so ``N`` may be large); ``center`` subtracts the mean row first."""
    x = x.double()
    if center:
        x = x - x.mean(0, keepdim=True)
    return _erank_from_gram(x.T @ x)


class GramAccumulator:
    """``X^T X``, column sums and row count of one layer's residual stream, accumulated in float64."""

    def __init__(self) -> None:
        self.gram: Tensor | None = None
        self.colsum: Tensor | None = None
        self.n = 0

    def add(self, x: Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).double()
        g, c = x.T @ x, x.sum(0)
        self.gram = g if self.gram is None else self.gram + g
        self.colsum = c if self.colsum is None else self.colsum + c
        self.n += x.shape[0]

    def erank(self, center: bool) -> float:
        assert self.gram is not None and self.colsum is not None
        if not center:
            return _erank_from_gram(self.gram)
        mean = self.colsum / self.n
        return _erank_from_gram(self.gram - self.n * torch.outer(mean, mean))


def erank_frame(model: ProbedModel, grams: dict[int, GramAccumulator]) -> pd.DataFrame:
    """One row per residual site: the embedding output (``layer = -1``) and every block's output."""
    types = {info.index: info.layer_type for info in model.layers}
    return pd.DataFrame.from_records(
        {
            "layer": layer,
            "site": "embed" if layer < 0 else "block_out",
            "layer_type": types.get(layer, "embedding"),
            "value": acc.erank(center=True),
            "uncentered": acc.erank(center=False),
            "tokens": acc.n,
        }
        for layer, acc in sorted(grams.items())
    )


def residual_effective_rank(model: ProbedModel, input_ids: Tensor, rows: Tensor | None = None) -> pd.DataFrame:
    """Effective rank of the residual stream after the embedding (``layer = -1``, ``site = "embed"``)
    and after every block (``site = "block_out"``), pooling the analysed positions of all inputs.
    ``value`` is centred, ``uncentered`` is not."""
    return StreamingAnalysis(model, rows, k=0, heads=False, residual=True).add(input_ids).erank()


# ---------------------------------------------------------------------------------------------
# Retrieval score (Wu et al. 2025)
# ---------------------------------------------------------------------------------------------
def rouge1_recall(reference: str, prediction: str) -> float:
    """ROUGE-1 recall: clipped unigram overlap over reference unigrams (lower-case alphanumeric
    tokens, no stemming)."""
    ref = Counter(re.findall(r"[a-z0-9]+", reference.lower()))
    pred = Counter(re.findall(r"[a-z0-9]+", prediction.lower()))
    total = sum(ref.values())
    return sum(min(c, pred[w]) for w, c in ref.items()) / total if total else 0.0


def retrieval_sample(model: ProbedModel, prompt: NeedlePrompt, max_new_tokens: int = 50) -> tuple[np.ndarray, dict]:
    """Decode one needle prompt greedily; returns per-head copy scores ``[layers, max_heads]`` and the
    sample's record (response, ROUGE-1 recall, kept or not).

    At each decode step, a head copies when its attention row's argmax key lies in the answer span
    and holds the very token this step produced; each copy adds ``1 / len(answer span)``.
    """
    scores = np.zeros((len(model.layers), max(info.n_heads for info in model.layers)))
    span = prompt.answer_end - prompt.answer_start
    ids = prompt.ids

    def probe(step: int, token: int, call: AttentionCall) -> None:
        st = attention_stats(call.q, call.k, window=call.window, scale=call.scale, topk=0)
        where = (st.argmax[0, :, -1] + call.key_start).cpu().numpy()  # absolute key position per head
        inside = (where >= prompt.answer_start) & (where < prompt.answer_end)
        for head in np.nonzero(inside)[0]:
            if ids[where[head]] == token:
                scores[call.layer, head] += 1 / span

    tokens = model.decode(torch.tensor([ids]), max_new_tokens, list(model.tokenizer.newline_ids), probe=probe)
    response = model.tokenizer.decode(tokens)
    recall = rouge1_recall(prompt.needle.answer, response)
    record = {
        "length": prompt.length,
        "depth": prompt.depth,
        "question": prompt.needle.question,
        "response": response,
        "rouge1_recall": recall,
        "kept": recall > 0.5,
        "haystack": prompt.haystack,
    }
    return scores, record


def score_prompts(
    model: ProbedModel,
    prompts: Iterable[NeedlePrompt],
    max_new_tokens: int = 50,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Retrieval scores of every head over ``prompts``: the mean copy score over the samples the model
    answered (ROUGE-1 recall > 0.5; NaN when none was), with ``n_kept`` and ``n_samples``;
    ``df.attrs["samples"]`` lists every sample (``sample`` = its index)."""
    total = np.zeros((len(model.layers), max(i.n_heads for i in model.layers)))
    kept, records = 0, []
    for n, prompt in enumerate(prompts):
        model.check_length(prompt.length + max_new_tokens)
        scores, record = retrieval_sample(model, prompt, max_new_tokens)
        records.append(record | {"sample": n})
        if record["kept"]:
            total += scores
            kept += 1
        if progress:
            progress(n + 1)
    mean = total / kept if kept else np.full_like(total, math.nan)
    frame = pd.DataFrame.from_records(
        {
            "layer": info.index,
            "head": h,
            "layer_type": info.layer_type,
            "value": float(mean[info.index, h]),
            "n_kept": kept,
            "n_samples": len(records),
        }
        for info in model.layers
        for h in range(info.n_heads)
    )
    frame.attrs["samples"] = pd.DataFrame.from_records(records)
    return frame


def retrieval_scores(
    model: ProbedModel,
    needles: Sequence[Needle] | None = None,
    lengths: Iterable[int] = (1000, 1750, 2500, 3250, 4000),
    depths: Iterable[float] = tuple(float(d) for d in np.linspace(0, 100, 10).round()),
    haystack: list | None = None,
    max_new_tokens: int = 50,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> pd.DataFrame:
    """Wu et al.'s retrieval score of every head (definition: docs/metrics.md), one sample per
    ``(length, depth, needle)`` of the sweep; see :func:`score_prompts` for the columns."""
    needles = list(needles or NEEDLES)
    prompts = (
        needle_prompt(model.tokenizer, needle, length, depth, seed=seed, files=haystack)
        for length in lengths
        for depth in depths
        for needle in needles
    )
    return score_prompts(model, prompts, max_new_tokens, progress)


def retrieval_heads(scores: pd.DataFrame, threshold: float = 0.1) -> pd.DataFrame:
    """Heads with score >= ``threshold``: counts and fractions per layer type and overall."""
    rows = []
    for kind, part in [("all", scores), *scores.groupby("layer_type")]:
        hits = int((part["value"] >= threshold).sum())
        rows.append(
            {
                "layer_type": kind,
                "retrieval_heads": hits,
                "heads": len(part),
                "fraction": hits / len(part) if len(part) else math.nan,
                "threshold": threshold,
            }
        )
    return pd.DataFrame.from_records(rows)
