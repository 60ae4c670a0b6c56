"""RULER-style samples fitted to a model's tokenizer and a target length.

Every task builds its prompt from a size ``n`` (noise lines, distractor needles, essay words, distinct
words, coded words or documents: RULER's haystack units). Two ways of choosing ``n`` (:class:`Fit`):

* ``ruler`` (the default), RULER's procedure: one size per task and length, found on a trial sample
  (a binary search on the rendered trial's token count; for ``fwe`` RULER's linear search), then each
  sample shrinks from it by RULER's whole step (``ruler_step``: 500 essay words, 25 or 5 lines, 10
  words or documents, ...) until it fits. Samples land below the target, as RULER's do. Where no
  whole step fits (short lengths, e.g. an essay haystack under about 2K tokens, where RULER's own loop
  never ends) that sample is fitted tightly and its ``fit`` says ``tight``.
* ``tight``: each sample's own largest ``n``: token counts of the pieces are computed once, so the
  predicted length of any ``n`` is a prefix sum; a binary search picks the largest ``n`` whose
  prediction fits, the rendered prompt is tokenised to confirm, and ``n`` shrinks while it does not
  fit. Samples fill the budget, so they are harder than RULER's at the same nominal length.

The budget is ``length - tokens_to_generate`` minus any reserved special tokens; every sample records
its ``fit`` and ``fill`` (``token_count / budget``). Samples are deterministic in
``(seed, task, length, index)``.

Sample fields follow RULER: ``index``, ``input`` (the prompt without the answer prefix), ``outputs``
(the references), ``length`` (the target), ``answer_prefix``, ``task``, ``token_count`` (tokens of
``input + answer_prefix``), ``haystack`` (which text filled it), plus ``budget``, ``size`` (``n``),
``fit``, ``fill``, ``source`` and ``tokenizer`` (the fingerprint of the tokenizer the sample was fitted to,
:attr:`headprobe.model.tokenizer.HFTokenizer.fingerprint`); cwe samples also ``cwe_rule`` (:class:`CweRule`).

A task whose smallest prompt does not fit a length (vt and cwe below about 1.3K and 2K tokens with a
byte-level tokenizer) is skipped at that length by :meth:`RulerGenerator.samples`: every sample of that
length records it in ``skipped_tasks`` (task -> about the shortest length it fits), read back by
:func:`headprobe.evals.ruler.samples.skipped_tasks`. A length at which no task fits is an error.
"""

from __future__ import annotations

import itertools
import math
import random
import string
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.qa import QASet, builtin_qa, load_hotpotqa, load_squad
from headprobe.evals.ruler.settings import CweRule, Fit, RulerError
from headprobe.evals.ruler.tasks import TASKS, Task
from headprobe.text.corpus import Writer
from headprobe.text.files import TextFileError, read_text_file
from headprobe.text.haystack import split_sentences
from headprobe.text.prompt_format import PLAIN, Wrapper
from headprobe.text.wordlists import shipped


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


# ---------------------------------------------------------------------------------------------
# Word sources
# ---------------------------------------------------------------------------------------------
def _pseudo_word(i: int) -> str:
    """Distinct pronounceable filler words for when the wonderwords vocabulary runs out."""
    syll = ("ba", "ke", "lo", "mi", "nu", "pa", "re", "so", "ti", "vu", "za", "do", "fe", "gi", "ho", "ju")
    out = ""
    i += 16 * 16  # at least three syllables
    while i:
        out += syll[i % 16]
        i //= 16
    return out


class EssayCorpus:
    """The words of the essay haystack: generated prose by default, or the user's text files."""

    def __init__(self, files: list[Path] | None = None) -> None:
        self.files = files
        self.words: list[str] = []
        if files:
            for f in files:
                try:
                    self.words += read_text_file(f, "haystack file").split()
                except TextFileError as err:
                    raise RulerError(str(err)) from None
            if not self.words:
                raise RulerError("the haystack files hold no words")
            self._base = len(self.words)
        else:
            self._writer = Writer(random.Random("headprobe-ruler-essay"))
        self.name = "files:" + ",".join(str(f) for f in files) if files else "builtin:generated-prose"

    def first(self, n: int) -> list[str]:
        """The first ``n`` words (a file corpus repeats when needed, like RULER's)."""
        while len(self.words) < n:
            if self.files:
                self.words += self.words[: self._base]
            else:
                self.words += " ".join(self._writer.prose(20_000)).split()
        return self.words[:n]


# ---------------------------------------------------------------------------------------------
# Token counting
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# The fitting loop
# ---------------------------------------------------------------------------------------------
@dataclass
class Draft:
    """A sample as a function of its size ``n``.

    ``render(n)`` gives ``(input, answer_prefix, outputs)``; ``predict(n)`` estimates the tokens of
    ``input + answer_prefix`` from piece counts (non-decreasing in ``n``); ``n`` ranges over
    ``[n_min, n_max]``; ``growable`` says whether the text can fill the budget. ``render`` gives the
    task prompt alone; :meth:`RulerGenerator.sample` puts it in the model wrapper, after ``example``.
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


def _grow(counts: Callable[[int], np.ndarray], budget: int, start: int = 64) -> np.ndarray:
    """Per-unit token counts for enough units to exceed ``budget`` tokens."""
    n = start
    while True:
        c = counts(n)
        if c.sum() > budget or len(c) < n:
            return c
        n *= 2


# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------
class RulerGenerator:
    """Makes samples of any task and length for one tokenizer.

    Args:
        tokenizer: the evaluated model's tokenizer (``encode``/``encode_batch``).
        seed: base seed; sample ``i`` of a task at a length is fixed by ``(seed, task, length, i)``.
        haystack_files: text files replacing the generated prose of the ``essay`` haystack.
        qa_files: ``{"squad": path, "hotpotqa": path}`` original dataset files (else the built-in set).
        reserve: tokens to keep free for special tokens the evaluator adds (e.g. a BOS).
        wrapper: RULER's model template around every task prompt (:mod:`headprobe.text.prompt_format`).
            Unlike RULER, the singular rewrite never edits the wrapper's own text.
        fit: ``ruler`` (RULER's size search and whole-step shrinking) or ``tight`` (:class:`Fit`).
        cwe_rule: ``ruler`` or ``fit`` (:class:`CweRule`).
    """

    def __init__(
        self,
        tokenizer,
        seed: int = 42,
        haystack_files: list[Path] | None = None,
        qa_files: dict[str, Path] | None = None,
        reserve: int = 0,
        wrapper: Wrapper = PLAIN,
        fit: Fit | str = Fit.RULER,
        cwe_rule: CweRule | str = CweRule.RULER,
    ) -> None:
        self.tokenizer, self.seed, self.reserve = tokenizer, seed, reserve
        self.fit, self.cwe_rule = Fit(fit), CweRule(cwe_rule)
        self._sizes: dict[tuple[str, int], int] = {}
        self.wrapper, self.prompt_format = wrapper.template, wrapper.format
        self.wrap_before, self.wrap_after = wrapper.before, wrapper.after
        self.counter = Counter(tokenizer)
        self.essay = EssayCorpus(haystack_files)
        self.qa_files = qa_files or {}
        self._qa: dict[str, QASet] = {}
        vocab = sorted(set(shipped("nouns")) | set(shipped("adjectives")) | set(shipped("verbs")))
        random.Random(seed).shuffle(vocab)
        self.cwe_vocab = vocab

    # -- public ----------------------------------------------------------------------------------
    def sample(self, task: str | Task, length: int, index: int) -> dict[str, Any]:
        """Sample ``index`` of ``task`` at ``length``; raises :class:`TooShort` when even its smallest prompt
        does not fit."""
        task = TASKS[task] if isinstance(task, str) else task
        budget = length - task.tokens_to_generate - self.reserve
        what = f"{task.name} at length {length}"
        draft, haystack, source = self._draft(task, max(budget, MIN_BUDGET), length, index)
        smallest = draft.predict(draft.n_min)
        if budget < MIN_BUDGET:
            raise TooShort(
                f"{what}: length {length} leaves no room after {task.tokens_to_generate} tokens to "
                "generate; use a longer length",
                smallest,
            )
        if smallest > budget:
            raise TooShort(
                f"{what}: even the smallest prompt needs about {smallest} tokens, more than the {budget} "
                "available; use a longer length",
                smallest,
            )
        if self.fit is Fit.TIGHT:
            text, prefix, outputs, n, count = fit(draft, budget, self.counter, what)
            used = Fit.TIGHT
        else:
            text, prefix, outputs, n, count, used = self._fit_ruler(task, length, budget, draft, what)
        sample = {
            "index": index,
            "input": text,
            "outputs": outputs,
            "length": length,
            "answer_prefix": prefix,
            "task": task.name,
            "token_count": count,
            "budget": budget,
            "size": n,
            "fit": str(used),
            "fill": count / budget,
            "haystack": haystack,
            "source": source,
            "wrapper": self.wrapper,
            "prompt_format": self.prompt_format,
            "tokenizer": self.tokenizer.fingerprint,
        }
        return sample | ({"cwe_rule": str(self.cwe_rule)} if task.family == "cwe" else {})

    def _draft(self, task: Task, budget: int, length: int, index: int | str) -> tuple[Draft, str, str]:
        """Sample ``index`` of ``task`` at ``length`` as a size-free draft, in the wrapper."""
        rng = random.Random(f"{self.seed}/{task.name}/{length}/{index}")
        build = {"niah": self._niah, "vt": self._vt, "cwe": self._cwe, "fwe": self._fwe, "qa": self._qa_draft}
        draft, haystack, source = build[task.family](task, rng, budget, length, index if isinstance(index, int) else 0)
        return self._wrapped(draft), haystack, source

    def _count(self, draft: Draft, n: int) -> tuple[str, str, list[str], int]:
        text, prefix, outputs = draft.render(n)
        return text, prefix, outputs, self.counter.one(text + prefix)

    def ruler_size(self, task: Task, length: int, budget: int) -> int:
        """RULER's one size for ``task`` at ``length``, found on trial samples as RULER's scripts find it:
        each test draws a fresh trial (seeded ``probe-0``, ``probe-1``, ...: samples of their own, not among
        those generated), as every ``generate_input_output`` call of RULER's draws new random needles.
        The first trial gives the tokens per unit for the upper bound (3x the length over the tokens per unit
        at one step; cwe: 2x, per unit at 4,096 words); a binary search from one step up to it keeps the
        last size whose trial fit. ``fwe``: RULER's linear search on one sample (its vocabulary is drawn
        once per call): up from ``budget // 6`` in steps until the first trial reaches the budget, then one
        step back. One step when nothing fits."""
        key = (task.name, length)
        if key not in self._sizes:
            # the trials' seed labels ("probe-<i>") are kept as they were: they decide the fitted sizes
            trials = (self._draft(task, budget, length, f"probe-{i}")[0] for i in itertools.count())
            trial = next(trials)
            step = ruler_step(task, length, budget)
            if task.family == "fwe":
                n = budget // 6
                while self._count(trial, n)[3] < budget:  # one sample throughout, as RULER's fwe
                    n += step
                size = n - step
            else:  # RULER's bounds: one step, and 3x (cwe: 2x) the tokens-per-unit estimate
                total = budget + task.tokens_to_generate  # RULER's max_seq_length, after the template
                if task.family == "cwe":
                    hi = int(total // (self._count(trial, 4096)[3] / 4096)) * 2
                else:
                    hi = int(total / (self._count(trial, step)[3] / step) * 3)
                size = rulers_search(step, max(hi, 2 * step), lambda n: self._count(next(trials), n)[3] <= budget)
            self._sizes[key] = size
        return self._sizes[key]

    def _fit_ruler(self, task: Task, length: int, budget: int, draft: Draft, what: str):
        """RULER's fit of one sample: the task's size, less whole steps until the sample fits; and the fit
        used. Where no whole step gets there (short lengths: RULER's own loop would never end), the
        sample is fitted tightly and says so."""
        n, step = self.ruler_size(task, length, budget), ruler_step(task, length, budget)
        while n >= draft.n_min:
            text, prefix, outputs, count = self._count(draft, n)
            if count <= budget:
                return text, prefix, outputs, n, count, Fit.RULER
            if n - step < max(draft.n_min, 1):
                break
            n -= step
        return (*fit(draft, budget, self.counter, what), Fit.TIGHT)

    def _wrap(self, prompt: str) -> str:
        return self.wrap_before + prompt + self.wrap_after

    def _wrapped(self, draft: Draft) -> Draft:
        """``draft`` with its prompt inside the wrapper (after its example); the wrapper's tokens are
        counted once, and ``fit``'s final tokenisation corrects any merge at the seams."""
        if self.wrapper == T.BASE_WRAPPER and not draft.example:
            return draft
        extra = self.counter.one(self.wrap_before + self.wrap_after) if self.wrapper != T.BASE_WRAPPER else 0

        def render(n: int) -> tuple[str, str, list[str]]:
            text, prefix, outputs = draft.render(n)
            return draft.example + self._wrap(text), prefix, outputs

        return Draft(render, lambda n: draft.predict(n) + extra, draft.n_min, draft.n_max, draft.growable)

    def _min_length(self, task: Task, err: TooShort) -> int:
        """About the shortest length at which ``task`` fits, from the :class:`TooShort` it raised."""
        return err.tokens + task.tokens_to_generate + self.reserve

    def samples(self, tasks: Iterable[Task], lengths: Iterable[int], n: int) -> Iterator[dict[str, Any]]:
        """``n`` samples of every task at every length, a length at a time. A task that does not fit a
        length is skipped there, and that length's samples record it in ``skipped_tasks`` (task -> about
        the shortest length it fits); raises when ``n`` < 1 or when no task fits a length."""
        if n < 1:
            raise RulerError(f"`samples` must be at least 1, got {n}")
        tasks = list(tasks)
        for length in lengths:
            made: list[dict[str, Any]] = []
            skipped: dict[str, int] = {}
            for task in tasks:
                try:
                    made += [self.sample(task, length, i) for i in range(n)]
                except TooShort as err:
                    skipped[task.name] = self._min_length(task, err)
            if not made:
                needs = ", ".join(f"{t} about {k:,}" for t, k in skipped.items())
                raise RulerError(
                    f"no task fits length {length:,} (the shortest each needs: {needs}); use longer `lengths`"
                )
            yield from (x | {"skipped_tasks": skipped} if skipped else x for x in made)

    # -- needles -------------------------------------------------------------------------------
    @staticmethod
    def _item(kind: str, rng: random.Random) -> str:
        if kind == "numbers":
            return str(rng.randint(10**6, 10**7 - 1))
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if kind == "words":
            return f"{rng.choice(shipped('adjectives'))}-{rng.choice(shipped('nouns'))}"
        raise RulerError(f"unknown needle type {kind!r}")

    def _niah(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        keys: list[str] = []
        while len(keys) < task.num_needle_k:
            if (key := self._item(task.type_needle_k, rng)) not in keys:
                keys.append(key)
        values = [[self._item(task.type_needle_v, rng) for _ in range(task.num_needle_v)] for _ in keys]
        needles = [
            T.NIAH_NEEDLE.format(type_needle_v=task.type_needle_v, key=k, value=v)
            for k, vs in zip(keys, values, strict=True)
            for v in vs
        ]
        random.Random(rng.random()).shuffle(needles)
        asked = rng.sample(range(len(keys)), task.num_needle_q)
        query_keys = [keys[i] for i in asked]
        outputs = [v for i in asked for v in values[i]]
        query = query_keys[0] if len(query_keys) == 1 else ", ".join(query_keys[:-1]) + ", and " + query_keys[-1]
        template, prefix, type_v = T.NIAH_TEMPLATE, T.NIAH_PREFIX, task.type_needle_v
        if task.num_needle_q * task.num_needle_v == 1:
            template, prefix, type_v = T.singular(template), T.singular(prefix), type_v[:-1]
        head, tail = template.format(type_needle_v=type_v, query=query, context="\x00").split("\x00")
        prefix = prefix.format(type_needle_v=type_v, query=query)
        fixed = self.counter.one(head + tail + prefix) + int(self.counter.many(needles).sum()) + len(needles)

        if task.haystack == "essay":
            depths = rng.sample([round(x) for x in np.linspace(0, 100, 40)], len(needles))
            word_counts = _grow(lambda n: self.counter.many([" " + w for w in self.essay.first(n)]), budget)
            prefix_sum = np.concatenate([[0], np.cumsum(word_counts)])

            def render(n: int):
                sentences = split_sentences(" ".join(self.essay.first(n)))
                for needle, depth in zip(needles, depths, strict=True):
                    sentences.insert(int(len(sentences) * depth / 100), needle)
                return head + " ".join(sentences) + tail, prefix, outputs

            return (
                Draft(render, lambda n: fixed + int(prefix_sum[n]), 0, len(word_counts)),
                self.essay.name,
                "RULER-style",
            )

        if task.haystack == "noise":
            unit = self.counter.one(T.NOISE_SENTENCE + "\n")
            lines_for = lambda n: [T.NOISE_SENTENCE] * n  # noqa: E731
            n_max = budget // max(1, unit) + 1
            predict = lambda n: fixed + unit * n  # noqa: E731
        else:  # distractor needles of the same types
            hay_rng = random.Random(rng.random())
            pool: list[str] = []

            def lines_for(n: int) -> list[str]:
                while len(pool) < n:
                    k, v = self._item(task.type_needle_k, hay_rng), self._item(task.type_needle_v, hay_rng)
                    if k not in keys:
                        pool.append(T.NIAH_NEEDLE.format(type_needle_v=task.type_needle_v, key=k, value=v))
                return pool[:n]

            counts = _grow(lambda n: self.counter.many([s + "\n" for s in lines_for(n)]), budget)
            prefix_sum = np.concatenate([[0], np.cumsum(counts)])
            n_max = len(counts)
            predict = lambda n: fixed + int(prefix_sum[n])  # noqa: E731
        slots = [rng.random() for _ in needles]

        def render_lines(n: int):
            lines = list(lines_for(n))
            for needle, at in sorted(zip(needles, slots, strict=True), key=lambda p: p[1]):
                lines.insert(int(at * (len(lines) + 1)), needle)
            return head + "\n".join(lines) + tail, prefix, outputs

        name = "noise" if task.haystack == "noise" else "needle"
        return Draft(render_lines, predict, 0, n_max), name, "RULER-style"

    # -- variable tracking -----------------------------------------------------------------------
    def _vt_parts(self, task: Task, rng: random.Random, name_len: int):
        names: list[str] = []
        while len(names) < 1 + task.num_hops:
            if (nm := "".join(rng.choice(string.ascii_uppercase) for _ in range(name_len))) not in names:
                names.append(nm)
        value = str(rng.randrange(10000, 99999))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(task.num_hops)]
        slots = sorted(rng.random() for _ in chain)
        return names, value, chain, slots

    def _vt_text(self, chain: list[str], slots: list[float], n: int) -> str:
        lines = [T.NOISE_SENTENCE] * n
        for offset, (line, at) in enumerate(zip(chain, slots, strict=True)):
            lines.insert(int(at * (n + 1)) + offset, line)
        return "\n".join(lines).replace(". \n", ".\n")

    def _vt_example_size(self, chain: list[str], slots: list[float], value: str, num_v: int) -> int:
        """Noise lines of vt's in-context example as RULER's ``variable_tracking.py`` sizes it: the largest
        count whose example (template and answer prefix) is at most 500 tokens, by its binary search from
        5 lines (upper bound 3x 500 over the tokens per line at 5 lines)."""

        def tokens(n: int) -> int:
            text = T.VT_TEMPLATE.format(context=self._vt_text(chain, slots, n), query=value)
            return self.counter.one(text + T.VT_PREFIX.format(num_v=num_v, query=value))

        step = 5
        return rulers_search(step, max(int(500 / (tokens(step) / step) * 3), 2 * step), lambda n: tokens(n) <= 500)

    def _vt(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        num_v = task.num_hops + 1
        # the in-context example, as RULER builds it: a small sample (about 500 tokens) with 3-letter
        # names, its answer after the prefix and one more space, a newline, then a blank line
        ex_names, ex_value, ex_chain, ex_slots = self._vt_parts(task, rng, 3)
        ex_n = self._vt_example_size(ex_chain, ex_slots, ex_value, num_v)
        example = (
            T.VT_TEMPLATE.format(context=self._vt_text(ex_chain, ex_slots, ex_n), query=ex_value)
            + T.VT_PREFIX.format(num_v=num_v, query=ex_value)
            + " "
            + " ".join(ex_names)
            + "\n\n"
        )
        names, value, chain, slots = self._vt_parts(task, rng, 5)
        head, tail = T.VT_TEMPLATE.format(context="\x00", query=value).split("\x00")
        prefix = T.VT_PREFIX.format(num_v=num_v, query=value)
        fixed = self.counter.one(example + head + tail + prefix) + int(
            self.counter.many([c + "\n" for c in chain]).sum()
        )
        unit = self.counter.one(T.NOISE_SENTENCE + "\n")

        def render(n: int):
            return example + head + self._vt_text(chain, slots, n) + tail, prefix, names

        return Draft(render, lambda n: fixed + unit * n, 0, budget // max(1, unit) + 1), "noise", "RULER-style"

    # -- common words ----------------------------------------------------------------------------
    def _cwe_words(self, rng: random.Random, n: int) -> list[str]:
        vocab = self.cwe_vocab
        if n > len(vocab):  # beyond wonderwords' 8,166 words: distinct generated words
            vocab = vocab + [_pseudo_word(i) for i in range(n - len(vocab))]
        order = random.Random(rng.random()).sample(range(len(vocab)), min(n, len(vocab)))
        return [vocab[i] for i in order]

    @staticmethod
    def _cwe_list(words: list[str], num_cw: int, freq_cw: int, freq_ucw: int, rng: random.Random) -> str:
        items = [w for w in words[:num_cw] for _ in range(freq_cw)] + [
            w for w in words[num_cw:] for _ in range(freq_ucw)
        ]
        rng.shuffle(items)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(items))

    def _cwe(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        # RULER's settings below 4,096 tokens (example 20 words x3/x1, main x6/x1); the "fit" rule also
        # uses them at longer lengths whose standard prompt cannot fit (e.g. byte-level tokenizers)
        small, standard = (6, 1, 20, 3, 1), (task.freq_cw, task.freq_ucw, 40, 10, 3)
        options = [standard] if self.cwe_rule is CweRule.RULER else [standard, small]
        settings = [small] if length < 4096 else options
        state = rng.getstate()
        for freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw in settings:
            rng.setstate(state)
            draft = self._cwe_draft(task, rng, budget, freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw)
            if draft.predict(draft.n_min) <= budget:
                break
        else:
            if self.cwe_rule is CweRule.RULER and length >= 4096:
                raise TooShort(
                    f"cwe at length {length}: RULER's word counts at 4,096 tokens and up (common x{freq_cw}, "
                    f"others x{freq_ucw}, a 40-word example) need about {draft.predict(draft.n_min)} tokens, more "
                    f"than the {budget} available (a byte-level tokenizer?); use `--cwe-rule fit` (the small "
                    "counts where the standard ones do not fit) or a longer length",
                    draft.predict(draft.n_min),
                )
        return draft, "words", f"RULER-style (common x{freq_cw}, others x{freq_ucw})"

    def _cwe_draft(self, task, rng, budget, freq_cw, freq_ucw, ex_words, ex_cw, ex_ucw) -> Draft:
        example_words = self._cwe_words(rng, ex_words)
        listing = self._cwe_list(example_words, task.num_cw, ex_cw, ex_ucw, rng)
        answer = " ".join(f"{i + 1}. {w}" for i, w in enumerate(example_words[: task.num_cw]))
        # RULER renders the example through the whole template, wrapper included, before the prompt
        example = self._wrap(T.CWE_TEMPLATE.format(context=listing)) + T.CWE_PREFIX + " " + answer + "\n"
        pool_seed = rng.random()
        head, tail = T.CWE_TEMPLATE.split("{context}")
        fixed = self.counter.one(example + head + tail + T.CWE_PREFIX)

        def words_for(n: int) -> list[str]:
            return self._cwe_words(random.Random(pool_seed), n)

        def predict(n: int) -> int:
            reps = np.array([freq_cw] * min(n, task.num_cw) + [freq_ucw] * max(0, n - task.num_cw))
            numbers = self.counter.many([f" {i + 1}." for i in range(int(reps.sum()))]).sum()
            return fixed + int(numbers) + int((self.counter.many([" " + w for w in words_for(n)]) * reps).sum())

        def render(n: int):
            ws = words_for(n)
            text = self._cwe_list(ws, task.num_cw, freq_cw, freq_ucw, random.Random(pool_seed + n))
            return head + text + tail, T.CWE_PREFIX, ws[: task.num_cw]

        n_max = task.num_cw + 1
        while predict(n_max) <= budget:
            n_max *= 2
        return Draft(render, predict, task.num_cw, n_max, example=example)

    # -- frequent words --------------------------------------------------------------------------
    def _fwe(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        from scipy.special import zeta

        vocab_size = max(8, (length - task.tokens_to_generate) // 50)
        coded = sorted({"".join(rng.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(vocab_size)})
        rng.shuffle(coded)
        coded[0] = "..."
        ranks = np.arange(1, len(coded) + 1, dtype=np.float64)
        shares = ranks ** (-task.alpha) / zeta(task.alpha)
        word_tokens = self.counter.many([" " + w for w in coded])
        head, tail = T.FWE_TEMPLATE.split("{context}")
        fixed = self.counter.one(head + tail + T.FWE_PREFIX)
        order_seed = rng.random()

        def counts(n: int) -> np.ndarray:
            return (n * shares).astype(np.int64)

        def render(n: int):
            tokens = [w for w, c in zip(coded, counts(n), strict=True) for _ in range(c)]
            random.Random(order_seed).shuffle(tokens)
            return head + " ".join(tokens) + tail, T.FWE_PREFIX, coded[1:4]

        n_min = math.ceil(4 / shares[3])  # the answer words must all occur
        n_max = n_min
        while fixed + int((counts(n_max) * word_tokens).sum()) <= budget:
            n_max *= 2
        return (
            Draft(render, lambda n: fixed + int((counts(n) * word_tokens).sum()), n_min, n_max),
            "coded-words",
            "RULER-style",
        )

    # -- question answering ----------------------------------------------------------------------
    def qa_set(self, dataset: str) -> QASet:
        if dataset not in self._qa:
            path = self.qa_files.get(dataset)
            if path is None:
                self._qa[dataset] = builtin_qa(dataset, seed=self.seed)
            else:
                self._qa[dataset] = load_squad(path) if dataset == "squad" else load_hotpotqa(path)
        return self._qa[dataset]

    def _qa_draft(self, task: Task, rng: random.Random, budget: int, length: int, index: int):
        qa = self.qa_set(task.dataset or "squad")
        question = qa.questions[index % len(qa.questions)]  # RULER: questions in file order
        gold, related = list(question.gold), [i for i in question.related if i not in question.gold]
        # RULER's choice of documents: while the related ones (the article's other paragraphs) suffice,
        # a random sample of them; beyond, all of them and a random sample of the rest
        taken = set(gold) | set(related)
        others: list[int] = []
        pick, pick_related = random.Random(rng.random()), rng.random()

        def docs_for(n: int) -> list[int]:
            if n - len(gold) <= len(related):
                return gold + random.Random(pick_related).sample(related, max(0, n - len(gold)))
            while len(gold) + len(related) + len(others) < n and len(taken) < qa.size:
                j = pick.randrange(qa.size)
                if j not in taken:
                    taken.add(j)
                    others.append(j)
            return gold + related + others[: n - len(gold) - len(related)]

        head, tail = T.QA_TEMPLATE.format(context="\x00", query=question.question).split("\x00")
        fixed = self.counter.one(head + tail + T.QA_PREFIX)

        def doc_counts(n: int) -> np.ndarray:
            ids = docs_for(n)
            return self.counter.many([qa.document(j) for j in ids])

        def predict(n: int) -> int:
            labels = self.counter.many([f"Document {i + 1}:\n" for i in range(n)]).sum() + 2 * max(0, n - 1)
            return fixed + int(doc_counts(n).sum()) + int(labels)

        def render(n: int):
            ids = docs_for(n)
            random.Random(self.seed).shuffle(ids)  # as RULER: one fixed-seed shuffle, the same for every sample
            context = "\n\n".join(f"Document {i + 1}:\n{qa.document(j)}" for i, j in enumerate(ids))  # as RULER
            return head + context + tail, T.QA_PREFIX, list(question.answers)

        n_min = len(gold)
        n_max = n_min + 1
        while n_max < qa.size and predict(n_max) <= budget:
            n_max = min(qa.size, n_max * 2)
        return Draft(render, predict, n_min, n_max), "documents", qa.source
