"""Fitting a RULER-style sample's size to a token budget.

Every task builds its prompt from a size ``n`` (noise lines, distractor needles, essay words, distinct
words, coded words or documents: RULER's haystack units), as a :class:`Draft`
(:mod:`headprobe.evals.ruler.builders`). Two ways of choosing ``n`` (:class:`Fit`):

* ``ruler`` (the default), RULER's procedure: one size per task and length, found on a trial sample
  (:func:`size_from_trials`: a binary search on the rendered trial's token count; for ``fwe`` RULER's linear
  search), then each sample shrinks from it by RULER's whole step (:func:`ruler_step`: 500 essay words, 25
  or 5 lines, 10 words or documents, ...) until it fits (:func:`fit_ruler`). Samples land below the target,
  as RULER's do. Where no whole step fits (short lengths, e.g. an essay haystack under about 2K tokens,
  where RULER's own loop never ends) that sample is fitted tightly and its ``fit`` says ``tight``.
* ``tight`` (:func:`fit`): each sample's own largest ``n``: token counts of the pieces are computed once
  (:class:`Counter`), so the predicted length of any ``n`` is a prefix sum; a binary search picks the
  largest ``n`` whose prediction fits, the rendered prompt is tokenised to confirm, and ``n`` shrinks while
  it does not fit. Samples fill the budget, so they are harder than RULER's at the same nominal length.

A prompt too long for its budget even at its smallest size raises :class:`TooShort`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from headprobe.evals.ruler.settings import Fit, RulerError
from headprobe.evals.ruler.tasks import Task


class TooShort(RulerError):
    """A task's smallest prompt does not fit the length asked for; ``tokens``: that prompt's tokens (about)."""

    def __init__(self, message: str, tokens: int) -> None:
        super().__init__(message)
        self.tokens = tokens


MIN_BUDGET = 16  # prompt tokens below which no task is generated


def ruler_step(task: Task, length: int, budget: int) -> int:
    """RULER's ``incremental`` for a task at ``length``: the step of its size search and of the shrinking
    of overflowing samples (``scripts/data/synthetic/*.py``)."""
    if task.family in ("niah", "vt"):
        if task.haystack == "essay":
            return 500
        if length < 4096:
            return 5
        return 25 if task.family == "niah" else 10
    if task.family == "fwe":
        return max(1, budget // 32)
    return 10  # cwe words, qa documents


class Counter:
    """Token counts with caches for pieces that recur (essay words, numbers, noise lines)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, int] = {}

    def many(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self.cache]
        for start in range(0, len(missing), 8192):
            part = missing[start : start + 8192]
            for t, ids in zip(part, self.tokenizer.encode_batch(part), strict=True):
                self.cache[t] = len(ids)
        return np.fromiter((self.cache[t] for t in texts), dtype=np.int64, count=len(texts))

    def one(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


@dataclass
class Draft:
    """A sample as a function of its size ``n``.

    ``render(n)`` gives ``(input, answer_prefix, outputs)``; ``predict(n)`` estimates the tokens of
    ``input + answer_prefix`` from piece counts (non-decreasing in ``n``); ``n`` ranges over
    ``[n_min, n_max]``; ``growable`` says whether the text can fill the budget. ``render`` gives the
    task prompt alone; :meth:`headprobe.evals.ruler.generate.RulerGenerator.sample` puts it in the model
    wrapper, after ``example``.
    """

    render: Callable[[int], tuple[str, str, list[str]]]
    predict: Callable[[int], int]
    n_min: int
    n_max: int
    growable: bool = True
    example: str = ""  # a few-shot example placed before the wrapped prompt (cwe); counted by predict


def fit(draft: Draft, budget: int, counter: Counter, what: str) -> tuple[str, str, list[str], int, int]:
    """The largest ``n`` that fits ``budget`` tokens: ``(input, prefix, outputs, n, token_count)``."""
    lo, hi = draft.n_min, draft.n_max
    if draft.predict(lo) > budget:
        raise TooShort(
            f"{what}: even the smallest prompt needs about {draft.predict(lo)} tokens, more than the "
            f"{budget} available; use a longer length",
            draft.predict(lo),
        )
    while lo < hi:  # largest n with predict(n) <= budget
        mid = (lo + hi + 1) // 2
        if draft.predict(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    n = lo
    while True:
        text, prefix, outputs = draft.render(n)
        count = counter.one(text + prefix)
        if count <= budget:
            return text, prefix, outputs, n, count
        if n <= draft.n_min:
            raise TooShort(
                f"{what}: the prompt does not fit {budget} tokens at its smallest size; use a longer length", count
            )
        per_unit = max(1.0, (draft.predict(n) - draft.predict(draft.n_min)) / max(1, n - draft.n_min))
        n = max(draft.n_min, n - max(1, math.ceil((count - budget) / per_unit)))


def rulers_search(lo: int, hi: int, fits: Callable[[int], bool]) -> int:
    """RULER's binary search over sizes ``[lo, hi]``: the last middle size that fitted, testing the lower
    middle each time, in RULER's order (``fits`` may draw a fresh sample per test); ``lo`` (one step)
    when none fits, as RULER's scripts fall back to ``incremental``."""
    size = lo
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            size, lo = mid, mid + 1
        else:
            hi = mid - 1
    return size


def counted(draft: Draft, n: int, counter: Counter) -> tuple[str, str, list[str], int]:
    """``draft`` rendered at size ``n``: ``(input, prefix, outputs, token_count)``."""
    text, prefix, outputs = draft.render(n)
    return text, prefix, outputs, counter.one(text + prefix)


def size_from_trials(task: Task, length: int, budget: int, trials: Iterator[Draft], counter: Counter) -> int:
    """RULER's one size for ``task`` at ``length``, found on trial samples as RULER's scripts find it:
    each test draws a fresh trial from ``trials`` (samples of their own, not among those generated), as
    every ``generate_input_output`` call of RULER's draws new random needles. The first trial gives the
    tokens per unit for the upper bound (3x the length over the tokens per unit at one step; cwe: 2x, per
    unit at 4,096 words); a binary search from one step up to it keeps the last size whose trial fit.
    ``fwe``: RULER's linear search on one sample (its vocabulary is drawn once per call): up from
    ``budget // 6`` in steps until the first trial reaches the budget, then one step back. One step when
    nothing fits."""
    trial = next(trials)
    step = ruler_step(task, length, budget)
    if task.family == "fwe":
        n = budget // 6
        while counted(trial, n, counter)[3] < budget:  # one sample throughout, as RULER's fwe
            n += step
        return n - step
    # RULER's bounds: one step, and 3x (cwe: 2x) the tokens-per-unit estimate
    total = budget + task.tokens_to_generate  # RULER's max_seq_length, after the template
    if task.family == "cwe":
        hi = int(total // (counted(trial, 4096, counter)[3] / 4096)) * 2
    else:
        hi = int(total / (counted(trial, step, counter)[3] / step) * 3)
    return rulers_search(step, max(hi, 2 * step), lambda n: counted(next(trials), n, counter)[3] <= budget)


def fit_ruler(
    draft: Draft, size: int, step: int, budget: int, counter: Counter, what: str
) -> tuple[str, str, list[str], int, int, Fit]:
    """RULER's fit of one sample: the task's ``size`` (:func:`size_from_trials`), less whole steps (``step``)
    until the sample fits: ``(input, prefix, outputs, n, token_count, fit used)``. Where no whole step gets there
    (short lengths: RULER's own loop would never end), the sample is fitted tightly (:func:`fit`) and says
    so."""
    n = size
    while n >= draft.n_min:
        text, prefix, outputs, count = counted(draft, n, counter)
        if count <= budget:
            return text, prefix, outputs, n, count, Fit.RULER
        if n - step < max(draft.n_min, 1):
            break
        n -= step
    return (*fit(draft, budget, counter, what), Fit.TIGHT)
