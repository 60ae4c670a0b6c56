"""Wu et al.'s (2025) retrieval score of every head, from greedy decoding of needle prompts, and its
teacher-forced form with the needle attention mass, defined for every model (docs/metrics.md).

At each decode step a head copies when its attention row's argmax key lies in the needle's answer
span and holds the very token that step produced. Two forms, from the same copies:

* ``value``, as Wu et al.'s code computes it: each copying step adds ``1 / len(answer span)``, so an answer
  that repeats a needle token counts it again and the score can pass 1 (a toy that repeats its answer
  scores 3.5);
* ``set_value``, as their paper defines it (``|g_h ∩ k| / |k|``): the needle tokens (prompt positions of
  the span) the head copied at least once, over the span's length: each counted once, so 0-1.

A head's score is the mean over the samples the model answered (ROUGE-1 recall > 0.5); failed samples
are excluded, not counted as zeros, so a model that answers no needle has no score at all. A head is a
retrieval head when its ``value`` is at least 0.1 (the study's rule, which analyze, show and study count
by); the same 0.1 applies to ``set_value``, which is never above ``value``, so the set form counts at most
as many heads.

Two scores defined for every model come from the same prompts, the needle's answer teacher-forced after
the prompt (:func:`forced_answer`) in one forward pass whose hook keeps only the answer steps' rows
(:func:`forced_rows`):

* ``forced_value`` (and ``forced_set_value``): Wu's rule at each answer step, the step's token being the
  forced answer token, never a decoded one (a forced retrieval head: ``forced_value >= 0.1``);
* ``forced_mass``: the attention mass each head puts on the answer span at the answer steps, 0-1; with a
  needle ``reach`` of ``r`` tokens, on the span and the ``r`` prompt tokens after it. A model whose
  sliding-window layers (window ``W``) sit below its full-attention layers can read the needle where those
  layers gathered it, at the ``W - 1`` positions after the span, instead of on the span itself: the toy
  models of the ``qk-norm`` recipe do (docs/metrics.md), so their mass on the span alone is near 0 while
  they answer. A head putting at least :data:`READING_MASS` there is a needle-reading head.

Both are means over every sample: nothing is decoded, so nothing is filtered.

The answer span is, by default, exactly the answer's tokens in the prompt (found by character offsets
when the prompt is built). ``span="reference"`` locates it as Wu et al.'s code does (``find_needle_idx``):
the first window of ``len(encode(answer))`` prompt tokens whose token *set* covers more than 90% of the
answer's; for answers of ten or more distinct tokens that window can start a token early, which lowers
a perfect copier's score (docs/metrics.md gives the numbers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from headprobe.core.choice import Choice
from headprobe.hooked.base import DecodeHook, HookedModel
from headprobe.metrics.attention import HEAD_COLUMNS
from headprobe.metrics.probe import PassHook, Probe, Shared, score_sample
from headprobe.model.config import LayerInfo
from headprobe.model.seam import AttentionCall
from headprobe.results import Column, Schema
from headprobe.stats import attention_stats
from headprobe.text.needles import NEEDLES, Needle, NeedlePrompt, needle_prompt

RETRIEVAL = Schema(
    "retrieval",
    (
        *HEAD_COLUMNS,
        Column(
            "value",
            "float",
            "mean over the kept samples of Wu et al.'s code's score: needle-token copies / answer-span length, a "
            "repeated copy counted again (can pass 1; NaN when no sample was kept)",
        ),
        Column(
            "set_value",
            "float",
            "the same mean of their paper's set form: needle tokens copied at least once / span length (0-1)",
        ),
        Column("n_kept", "int", "samples the model answered (ROUGE-1 recall > 0.5)"),
        Column("n_samples", "int", "needle samples decoded"),
        Column(
            "forced_value",
            "float",
            "mean over every sample of the teacher-forced copy score: answer steps whose argmax key is the span's "
            "token being forced / span length (0-1 when the answer's tokens are the span's)",
        ),
        Column("forced_set_value", "float", "its set form: span tokens copied at least once / span length (0-1)"),
        Column(
            "forced_mass",
            "float",
            "mean over every sample of the attention mass on the answer span (and the needle reach after it) at the "
            "forced answer steps (0-1)",
        ),
    ),
)
RETRIEVAL_SAMPLES = Schema(
    "retrieval_samples",
    (
        Column("sample", "int", "index of the needle sample"),
        Column("length", "int", "prompt tokens"),
        Column("depth", "float", "needle depth (percent of the haystack)"),
        Column("question", "str"),
        Column("response", "str", "the greedy answer"),
        Column("rouge1_recall", "float", "ROUGE-1 recall of the answer against the needle's"),
        Column("kept", "bool", "counted in the scores"),
        Column("span_start", "int", "first prompt token of the answer span scored (-1: none found)"),
        Column("span_end", "int", "one past its last token"),
        Column("haystack", "str", "the text around the needle"),
        Column("prompt_format", "str", "the prompt's wrapper: plain, chat or custom (headprobe.text.prompt_format)"),
        Column("stop", "str", "the token that ended decoding ('' when the budget ran out)"),
        Column("answer_steps", "int", "answer tokens teacher-forced and scored (forced_value, forced_mass)"),
    ),
)
RETRIEVAL_COPIES = Schema(
    "retrieval_copies",
    (
        *HEAD_COLUMNS,
        Column("sample", "int", "index of the needle sample"),
        Column(
            "value",
            "float",
            "the head's copy score in this sample: copies / span length, repeats counted (in `retrieval` if kept)",
        ),
        Column("set_value", "float", "its set form: needle tokens copied at least once / span length (0-1)"),
        Column("forced_value", "float", "the teacher-forced copy score in this sample (in `retrieval`, every sample)"),
        Column("forced_set_value", "float", "its set form (0-1)"),
        Column(
            "forced_mass",
            "float",
            "mean attention mass on the answer span (and the needle reach after it) over the forced answer steps (0-1)",
        ),
    ),
)


READING_MASS = 0.1  # a needle-reading head: at least this forced mass (25x a uniform head's at 1,024 tokens and 4)


class Span(Choice, what="retrieval span"):
    """How the answer span a copy must land in is found."""

    EXACT = "exact"  # the answer's own tokens, by character offsets (headprobe's default)
    REFERENCE = "reference"  # Wu et al.'s find_needle_idx: first window with > 90% token-set overlap


def reference_span(prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> tuple[int, int]:
    """Wu et al.'s needle span: the first ``i`` such that ``prompt_ids[i : i + n]`` (``n`` the answer's
    token count) holds more than 90% of the answer's distinct tokens; ``(-1, -1)`` when none does (then
    no head can score, as in the reference)."""
    wanted = set(answer_ids)
    n = len(answer_ids)
    for i in range(len(prompt_ids)):
        if len(set(prompt_ids[i : i + n]) & wanted) / len(wanted) > 0.9:
            return i, i + n
    return -1, -1


def answer_span(model: HookedModel, prompt: NeedlePrompt, span: Span | str = Span.EXACT) -> tuple[int, int]:
    """``[start, end)`` of the prompt tokens a copy must land in (:class:`Span`)."""
    if Span(span) is Span.EXACT:
        return prompt.answer_start, prompt.answer_end
    return reference_span(prompt.ids, model.tokenizer.encode(prompt.needle.answer))


@dataclass(frozen=True)
class RetrievalScores:
    """The tables of a retrieval run: ``heads`` (one row per layer x head, :data:`RETRIEVAL`), ``samples``
    (one row per needle prompt, :data:`RETRIEVAL_SAMPLES`) and ``copies`` (one row per sample x layer x
    head, :data:`RETRIEVAL_COPIES`), from which ``heads`` is computed (:func:`head_scores`)."""

    heads: pd.DataFrame
    samples: pd.DataFrame
    copies: pd.DataFrame


@functools.cache
def _rouge1():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


def rouge1_recall(reference: str, prediction: str) -> float:
    """ROUGE-1 recall of ``prediction`` against ``reference`` as Wu et al. compute it: the
    ``rouge-score`` package, Porter stemming (``RougeScorer(["rouge1"], use_stemmer=True)``): clipped
    overlap of lower-cased alphanumeric tokens over the reference's tokens."""
    return float(_rouge1().score(reference, prediction)["rouge1"].recall)


def decode_argmax(
    model: HookedModel,
    ids: Sequence[int],
    max_new_tokens: int,
    stop_ids: Sequence[int] = (),
    state: Any = None,
    hook: DecodeHook | None = None,
) -> tuple[list[int], np.ndarray]:
    """Greedy decoding of the prompt ``ids`` (:meth:`HookedModel.decode`, from ``state`` when the prompt
    minus its last token is already prefilled) that records, at every step, where each head's attention
    row peaks: returns the produced tokens and ``argmax [steps, layers, max_heads]``, the absolute key
    position of each head's largest score (first on ties; -1 where a layer has fewer heads). ``hook``
    also sees every step's calls."""
    width = max(info.n_heads for info in model.layers)
    rows: dict[int, np.ndarray] = {}

    def record(step: int, token: int, call: AttentionCall) -> None:
        st = attention_stats(call.q, call.k, window=call.window, scale=call.scale, topk=0)
        row = rows.setdefault(step, np.full((len(model.layers), width), -1, dtype=np.int64))
        row[call.layer, : call.q.shape[1]] = (st.argmax[0, :, -1] + call.key_start).cpu().numpy()
        if hook is not None:
            hook(step, token, call)

    resume = {} if state is None else {"state": state}  # models that decode their own way need not take it
    tokens = model.decode(torch.tensor([list(ids)]), max_new_tokens, list(stop_ids), hook=record, **resume)
    if not tokens:
        return tokens, np.zeros((0, len(model.layers), width), dtype=np.int64)
    return tokens, np.stack([rows[step] for step in range(len(tokens))])


class CopyScores(NamedTuple):
    """One sample's copy scores of every head, each ``[layers, heads]``: ``value``, Wu et al.'s code's (each
    step that copies a needle token adds ``1 / span length``: repeats count, so it can pass 1), and
    ``set_value``, their paper's set form (the needle tokens copied at least once over the span length: 0-1)."""

    value: np.ndarray
    set_value: np.ndarray


def copy_scores(
    argmax: np.ndarray, tokens: Sequence[int], ids: Sequence[int], spans: Sequence[tuple[int, int]]
) -> CopyScores:
    """Both copy scores of every head for one decoded sample, in one pass over the steps: a head copies at a
    step when its argmax key (``argmax [steps, layers, heads]``, absolute prompt positions) lies in an answer
    span and holds the very token the step produced. Each copy adds ``1 / len(span)`` to ``value``; each
    span position copied at least once adds ``1 / len(span)`` to ``set_value``."""
    value = np.zeros(argmax.shape[1:])
    copied = [np.zeros((*argmax.shape[1:], max(end - start, 0)), dtype=bool) for start, end in spans]
    prompt = np.asarray(ids)
    for step, token in enumerate(tokens):
        where = argmax[step]
        copies = prompt[np.clip(where, 0, len(prompt) - 1)] == token
        for (start, end), seen in zip(spans, copied, strict=True):
            hit = (where >= start) & (where < end) & copies
            value += hit / max(end - start, 1)
            layer, head = np.nonzero(hit)
            seen[layer, head, where[layer, head] - start] = True
    set_value = sum((seen.sum(-1) / max(seen.shape[-1], 1) for seen in copied), np.zeros(argmax.shape[1:]))
    return CopyScores(value, set_value)


class ForcedScores(NamedTuple):
    """One sample's teacher-forced scores of every head, each ``[layers, heads]``: ``value`` and ``set_value``,
    Wu's rule (:func:`copy_scores`) at the forced answer steps, and ``forced_mass``, the attention mass on the
    answer span averaged over those steps (0-1)."""

    value: np.ndarray
    set_value: np.ndarray
    forced_mass: np.ndarray


def forced_answer(tokenizer: Any, prompt: NeedlePrompt) -> tuple[list[int], list[int]]:
    """The needle's answer as teacher-forced after ``prompt``: ``(tokens, steps)``.

    ``tokens`` are the ids that follow the prompt's text when it goes on with the answer, behind a space
    unless the text ends in whitespace (``"...Answer:"`` + ``" eat saffron..."``; ``"...is"`` + ``" 4471"``),
    tokenised with the text as a model reads it. ``steps`` index the tokens that overlap the answer's
    characters (the rule that finds the span in the prompt): the answer steps; a token holding only the
    space (a byte-level model's ``" "``) is forced but not scored. Where the prompt's tokens are not a
    prefix of that tokenisation (a tokenizer merging across the boundary, or a prompt without its text),
    the answer's own tokens in the prompt (``ids[answer_start:answer_end]``), every one an answer step."""
    text, answer = prompt.text, prompt.needle.answer
    lead = "" if not text or text[-1].isspace() else " "
    ids, offsets = tokenizer.encode_offsets(text + lead + answer)
    head = sum(1 for _, end in offsets if end <= len(text))  # the tokens wholly inside the text
    a, b = len(text) + len(lead), len(text) + len(lead) + len(answer)
    steps = [i - head for i, (s, e) in enumerate(offsets[head:], head) if s < b and e > a]
    clean = head < len(ids) and offsets[head][0] >= len(text) and 0 < head <= len(prompt.ids)
    if text and clean and steps and prompt.ids[len(prompt.ids) - head :] == ids[:head]:
        return ids[head:], steps
    own = prompt.ids[prompt.answer_start : prompt.answer_end]
    return own, list(range(len(own)))


class ForcedPrompt(NamedTuple):
    """A needle prompt with its answer teacher-forced (:func:`forced_prompt`): ``ids``, the prompt and the
    forced answer but its last token (one forward pass); ``rows``, the answer steps' absolute positions;
    ``targets``, the token each answer step produces; ``span``, the answer span ``[start, end)`` in the
    prompt (where a copy must land); ``read``, the needle's keys, the span and the reach after it."""

    ids: list[int]
    rows: list[int]
    targets: list[int]
    span: tuple[int, int]
    read: tuple[int, int]


def forced_prompt(
    model: HookedModel, prompt: NeedlePrompt, span: Span | str = Span.EXACT, reach: int = 0
) -> ForcedPrompt:
    """``prompt`` with its answer forced (:func:`forced_answer`): answer step ``t`` is the row whose next token
    is the answer's ``t``-th scored token (the last prompt token's row first when the answer starts at once);
    the needle's keys are the answer span (:func:`answer_span`) and the ``reach`` prompt tokens after it, never
    past the prompt's end. Refuses (:meth:`HookedModel.check_length`) a prompt and answer beyond the model."""
    start, end = answer_span(model, prompt, span)
    tokens, steps = forced_answer(model.tokenizer, prompt)
    model.check_length(prompt.length + len(tokens) - 1)
    rows = [prompt.length - 1 + i for i in steps]
    read = (start, max(end, min(end + reach, prompt.length)))
    return ForcedPrompt([*prompt.ids, *tokens[:-1]], rows, [tokens[i] for i in steps], (start, end), read)


def call_rows(call: AttentionCall, wanted: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Which of the absolute positions ``wanted [n]`` are query rows of ``call``: their indices into
    ``wanted`` and their query indices in the call (both empty when none is)."""
    at = wanted - call.query_start
    inside = (at >= 0) & (at < call.q.shape[2])
    return inside.nonzero()[:, 0].numpy(), at[inside]


def forced_rows(
    model: HookedModel, ids: Sequence[int], rows: Sequence[int], span: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """One forward pass over ``ids`` (the prompt and the forced answer but its last token) whose hook
    (:func:`forced_hook`) computes, at the query ``rows`` only (absolute positions: the answer steps), each
    head's attention argmax and its mass on ``span`` (``[start, end)`` key positions) by
    :func:`attention_stats`, never an ``L x L`` matrix. Returns ``argmax [rows, layers, max_heads]`` (absolute
    key positions, -1 where a layer has fewer heads) and ``mass [rows, layers, max_heads]`` (0-1; 0 there, and
    for a span out of reach)."""
    argmax, mass, hook = forced_hook(model, rows, span)
    score_sample(model, Probe(((tuple(ids), hook),), lambda: None))
    return argmax, mass


def forced_hook(
    model: HookedModel, rows: Sequence[int], span: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, PassHook]:
    """:func:`forced_rows`'s arrays, empty, and the hook that fills them during a pass."""
    width = max(info.n_heads for info in model.layers)
    argmax = np.full((len(rows), len(model.layers), width), -1, dtype=np.int64)
    mass = np.zeros((len(rows), len(model.layers), width))
    wanted = torch.as_tensor(list(rows), dtype=torch.long)

    def record(call: AttentionCall, memo: Shared) -> None:
        found, at = call_rows(call, wanted)
        if not len(found):
            return
        first, last = max(span[0] - call.key_start, 0), min(span[1] - call.key_start, call.k.shape[2])
        spans = [(first, last)] if first < last else []
        st = attention_stats(call.q, call.k, window=call.window, scale=call.scale, rows=at, spans=spans, topk=0)
        heads = call.q.shape[1]
        argmax[found, call.layer, :heads] = (st.argmax[0] + call.key_start).T.cpu().numpy()
        if spans:
            mass[found, call.layer, :heads] = st.span_mass[0, :, :, 0].T.double().cpu().numpy()

    return argmax, mass, record


def forced_scores(
    model: HookedModel, prompt: NeedlePrompt, span: Span | str = Span.EXACT, reach: int = 0
) -> tuple[ForcedScores, int]:
    """The teacher-forced scores of every head for one needle prompt (:class:`ForcedScores`, ``[layers,
    max_heads]`` each) and the number of answer steps scored. The answer (:func:`forced_answer`) follows the
    prompt; answer step ``t`` is the row whose next token is the answer's ``t``-th scored token ``a_t`` (the
    last prompt token's row first when the answer starts at once). A head copies at step ``t`` when its
    argmax key lies in the answer span (:func:`answer_span`) and holds ``a_t``: Wu's rule with ``a_t`` in
    place of a decoded token. ``forced_mass`` is the mass on the span and the ``reach`` prompt tokens after
    it (never past the prompt's end)."""
    forced = forced_prompt(model, prompt, span, reach)
    argmax, mass = forced_rows(model, forced.ids, forced.rows, forced.read)
    return forced_result(forced, argmax, mass, prompt.ids), len(forced.rows)


def forced_result(forced: ForcedPrompt, argmax: np.ndarray, mass: np.ndarray, ids: Sequence[int]) -> ForcedScores:
    """:class:`ForcedScores` from the answer rows' argmax keys and masses (:func:`forced_rows`) of ``forced``, a
    prompt of ``ids`` with its answer forced."""
    copies = copy_scores(argmax, forced.targets, ids, [forced.span])
    return ForcedScores(copies.value, copies.set_value, mass.mean(0))


def retrieval_sample(
    model: HookedModel, prompt: NeedlePrompt, max_new_tokens: int = 50, span: Span | str = Span.EXACT
) -> tuple[CopyScores, dict]:
    """Decode one needle prompt greedily; returns per-head copy scores (:class:`CopyScores`, ``[layers,
    max_heads]`` each) and the sample's record (response, ROUGE-1 recall, kept or not, the span scored)."""
    start, end = answer_span(model, prompt, span)
    stops = answer_stops(model)
    tokens, argmax = decode_argmax(model, prompt.ids, max_new_tokens, stops)
    scores = copy_scores(argmax, tokens, prompt.ids, [(start, end)])
    response = model.tokenizer.decode(tokens)
    recall = rouge1_recall(prompt.needle.answer, response)
    ended = tokens[-1] if tokens and tokens[-1] in stops else None
    record = {
        "length": prompt.length,
        "depth": prompt.depth,
        "question": prompt.needle.question,
        "response": response,
        "rouge1_recall": recall,
        "kept": recall > 0.5,
        "span_start": start,
        "span_end": end,
        "haystack": prompt.haystack,
        "prompt_format": prompt.prompt_format,
        "stop": "" if ended is None else (model.tokenizer.decode([ended]) or model.tokenizer.token_text(ended) or ""),
    }
    return scores, record


def answer_stops(model: HookedModel) -> list[int]:
    """Where a needle answer ends: at a newline, as in Wu et al.'s code, or at any end-of-text or
    end-of-turn token the model declares (:attr:`HookedModel.stop_ids`)."""
    return list(dict.fromkeys([*model.tokenizer.newline_ids, *model.stop_ids]))


def diagnose(samples: pd.DataFrame, needles: str, chat_template: bool) -> str:
    """Why few or no needle samples were kept, and what to try: ``samples`` are one length's
    :data:`RETRIEVAL_SAMPLES` rows; ``needles`` the needle set; ``chat_template`` whether the model has one."""
    failed = samples[~samples["kept"].astype(bool)]
    empty = int((failed["response"].str.strip() == "").sum())
    ran_on = int(((failed["response"].str.strip() != "") & (failed["stop"] == "")).sum())
    why = []
    if empty:
        why.append(f"{empty} answered nothing (an empty line or an end token first)")
    if len(failed) - empty:
        why.append(f"{len(failed) - empty} answered without the needle's words (ROUGE-1 recall <= 0.5)")
    if ran_on:
        why.append(f"{ran_on} ran to the decoding budget without an end token")
    formats = set(samples["prompt_format"]) if "prompt_format" in samples else {"plain"}
    examples = "; ".join(repr(r)[:60] for r in failed["response"].head(2))
    return f"{'; '.join(why)} (e.g. {examples}); try " + ", or ".join(retrieval_tries(formats, needles, chat_template))


def retrieval_tries(formats: set[str], needles: str, chat_template: bool) -> list[str]:
    """What to try when a model answered few needle prompts, only what this model accepts: its chat template
    where it has one and was not asked in it (``formats``: the prompt formats it was asked in), the code
    needles for a model without one (headprobe's toys), plain-word needles for an instruct model, shorter
    lengths."""
    tries = []
    if chat_template and formats != {"chat"}:
        tries.append("`--prompt-format chat` (the model has a chat template)")
    if needles == "builtin" and not chat_template:
        tries.append("`--needles codes` if this is one of headprobe's toy models (trained on code facts)")
    if needles == "codes" and chat_template:
        tries.append("`--needles builtin` (questions in plain words) for an instruction-tuned model")
    tries.append("shorter `--lengths` (the model may not retrieve this far)")
    return tries


FORCED = ("forced_value", "forced_set_value", "forced_mass")  # the teacher-forced columns, in ForcedScores' order


def copy_rows(layers: Sequence[LayerInfo], scores: CopyScores, forced: ForcedScores, sample: int) -> pd.DataFrame:
    """One sample's copy scores (:class:`CopyScores`) and teacher-forced scores (:class:`ForcedScores`) as
    :data:`RETRIEVAL_COPIES` rows (every head)."""
    return pd.DataFrame.from_records(
        {"layer": info.index, "head": h, "layer_type": str(info.layer_type), "sample": sample,
         "value": float(scores.value[info.index, h]), "set_value": float(scores.set_value[info.index, h]),
         **{name: float(part[info.index, h]) for name, part in zip(FORCED, forced, strict=True)}}
        for info in layers
        for h in range(info.n_heads)
    )  # fmt: skip


def head_scores(copies: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """The :data:`RETRIEVAL` head table from every sample's copy scores and the samples' records: each
    head's copy scores (both forms) summed over the kept samples in sample order, over their number (NaN
    when none was kept), and its teacher-forced scores (:data:`FORCED`) summed the same way over every
    sample (NaN when there is none). The same sums in the same order whether the samples were decoded by
    one process or many."""
    kept = set(samples.loc[samples["kept"].astype(bool), "sample"].astype(int))
    heads = copies[copies["sample"] == copies["sample"].min()][["layer", "head", "layer_type"]].reset_index(drop=True)
    total, every = np.zeros((len(heads), 2)), np.zeros((len(heads), len(FORCED)))
    for sample, rows in copies.groupby("sample", sort=True):
        every = every + rows[list(FORCED)].to_numpy(np.float64)
        if int(sample) in kept:
            total = total + rows[["value", "set_value"]].to_numpy(np.float64)
    mean = total / len(kept) if kept else np.full((len(heads), 2), math.nan)
    forced = every / len(samples) if len(samples) else np.full((len(heads), len(FORCED)), math.nan)
    return heads.assign(
        value=mean[:, 0], set_value=mean[:, 1], n_kept=len(kept), n_samples=len(samples),
        **{name: forced[:, i] for i, name in enumerate(FORCED)},
    )  # fmt: skip


def sample_probe(
    model: HookedModel,
    prompt: NeedlePrompt,
    sample: int,
    max_new_tokens: int = 50,
    span: Span | str = Span.EXACT,
    reach: int = 0,
) -> Probe:
    """:func:`sample_tables` as a :class:`~headprobe.metrics.probe.Probe`: the forced pass (shared with the other
    definitions of the sample), then the greedy decode; its result is the per-sample tables by name."""
    model.check_length(prompt.length + max_new_tokens)
    forced = forced_prompt(model, prompt, span, reach)
    argmax, mass, hook = forced_hook(model, forced.rows, forced.read)

    def score() -> dict[str, pd.DataFrame]:
        scores, record = retrieval_sample(model, prompt, max_new_tokens, span)
        steps = {"answer_steps": len(forced.rows)}
        teacher = forced_result(forced, argmax, mass, prompt.ids)
        return {
            RETRIEVAL_SAMPLES.table: pd.DataFrame.from_records([{"sample": sample} | record | steps]),
            RETRIEVAL_COPIES.table: copy_rows(model.layers, scores, teacher, sample),
        }

    return Probe(((tuple(forced.ids), hook),), score)


def sample_tables(
    model: HookedModel,
    prompt: NeedlePrompt,
    sample: int,
    max_new_tokens: int = 50,
    span: Span | str = Span.EXACT,
    reach: int = 0,
) -> dict[str, pd.DataFrame]:
    """One needle prompt decoded as sample number ``sample``, and its answer teacher-forced
    (:func:`forced_scores`, with the needle ``reach``): its :data:`RETRIEVAL_SAMPLES` row and its
    :data:`RETRIEVAL_COPIES` rows, by table name (:func:`head_scores` makes the head table of many)."""
    return score_sample(model, sample_probe(model, prompt, sample, max_new_tokens, span, reach))


def combine_samples(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """``{"retrieval": head table}`` from the ``retrieval_samples`` and ``retrieval_copies`` of every sample."""
    return {RETRIEVAL.table: head_scores(frames[RETRIEVAL_COPIES.table], frames[RETRIEVAL_SAMPLES.table])}


def score_prompts(
    model: HookedModel,
    prompts: Iterable[NeedlePrompt],
    max_new_tokens: int = 50,
    progress: Callable[[int], None] | None = None,
    span: Span | str = Span.EXACT,
    reach: int = 0,
) -> RetrievalScores:
    """Retrieval scores of every head over ``prompts``: the mean copy score over the samples the model
    answered (NaN when none was), with ``n_kept`` and ``n_samples``; every sample's record and copy
    scores. ``span``: which answer span a copy must land in (:class:`Span`); ``reach``: prompt tokens after
    it that the forced mass counts too (:func:`forced_scores`)."""
    done: list[dict[str, pd.DataFrame]] = []
    for n, prompt in enumerate(prompts):
        done.append(sample_tables(model, prompt, n, max_new_tokens, span, reach))
        if progress:
            progress(n + 1)
    if not done:  # no prompt: every head scores NaN over zero samples
        width = max(info.n_heads for info in model.layers)
        zero = np.zeros((len(model.layers), width))
        every_head = copy_rows(model.layers, CopyScores(zero, zero), ForcedScores(zero, zero, zero), 0)
        return RetrievalScores(head_scores(every_head, RETRIEVAL_SAMPLES.empty()), RETRIEVAL_SAMPLES.empty(),
                               every_head.iloc[:0])  # fmt: skip
    samples, copies = (
        pd.concat([d[t.table] for d in done], ignore_index=True) for t in (RETRIEVAL_SAMPLES, RETRIEVAL_COPIES)
    )
    return RetrievalScores(head_scores(copies, samples), samples, copies)


def retrieval_scores(
    model: HookedModel,
    needles: Sequence[Needle] | None = None,
    lengths: Iterable[int] = (1000, 1750, 2500, 3250, 4000),
    depths: Iterable[float] = tuple(float(d) for d in np.linspace(0, 100, 10).round()),
    haystack: list[Path] | None = None,
    max_new_tokens: int = 50,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    span: Span | str = Span.EXACT,
    reach: int = 0,
) -> RetrievalScores:
    """Wu et al.'s retrieval score of every head (definition: docs/metrics.md), one sample per
    ``(length, depth, needle)`` of the sweep; see :func:`score_prompts`."""
    needles = list(needles or NEEDLES)
    prompts = (
        needle_prompt(model.tokenizer, needle, length, depth, seed=seed, files=haystack, start=model.prompt_start)
        for length in lengths
        for depth in depths
        for needle in needles
    )
    return score_prompts(model, prompts, max_new_tokens, progress, span, reach)


def retrieval_heads(
    scores: pd.DataFrame, threshold: float = 0.1, strict: bool = False, score: str = "value"
) -> pd.DataFrame:
    """Heads whose ``score`` column (``value``: Wu's; ``forced_value``: teacher-forced) is >= ``threshold``
    (``strict``: > ``threshold``): counts and fractions per layer type and overall.

    The convention: the study's definition (docs/metrics.md) counts scores of at least 0.1; Wu et al.'s
    paper words it as "larger than 0.1" (``strict=True``). They differ only for a head scoring exactly
    0.1, e.g. one copying every token of a 10-token answer in one kept sample out of ten.
    """
    rows = []
    for kind, part in [("all", scores), *scores.groupby("layer_type")]:
        passed = part[score] > threshold if strict else part[score] >= threshold
        hits = int(passed.sum())
        rows.append(
            {
                "layer_type": kind,
                "retrieval_heads": hits,
                "heads": len(part),
                "fraction": hits / len(part) if len(part) else math.nan,
                "threshold": threshold,
                "strict": strict,
            }
        )
    return pd.DataFrame.from_records(rows)
