"""RULER-style samples fitted to a model's tokenizer and a target length: :class:`RulerGenerator`, which
draws each sample's draft (:mod:`headprobe.evals.ruler.builders`), puts it in the model's wrapper and fits its
size to the budget (:mod:`headprobe.evals.ruler.fitting`: ``ruler``, RULER's size search, or ``tight``).

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
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from headprobe.evals.ruler import templates as T
from headprobe.evals.ruler.builders import TaskBuilders
from headprobe.evals.ruler.fitting import (
    MIN_BUDGET,
    Counter,
    Draft,
    TooShort,
    fit,
    fit_ruler,
    ruler_step,
    size_from_trials,
)
from headprobe.evals.ruler.settings import CweRule, Fit, RulerError
from headprobe.evals.ruler.tasks import TASKS, Task
from headprobe.text.prompt_format import PLAIN, Wrapper


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
        self.builders = TaskBuilders(self.counter, seed, haystack_files, qa_files, self.cwe_rule, wrapper)

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
            size, step = self.ruler_size(task, length, budget), ruler_step(task, length, budget)
            text, prefix, outputs, n, count, used = fit_ruler(draft, size, step, budget, self.counter, what)
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
        draft, haystack, source = self.builders.draft(task, rng, budget, length, index if isinstance(index, int) else 0)
        return self._wrapped(draft), haystack, source

    def ruler_size(self, task: Task, length: int, budget: int) -> int:
        """RULER's one size for ``task`` at ``length`` (:func:`headprobe.evals.ruler.fitting.size_from_trials`),
        found once per task and length on trial samples seeded ``probe-0``, ``probe-1``, ...: samples of their
        own, not among those generated."""
        key = (task.name, length)
        if key not in self._sizes:
            # the trials' seed labels ("probe-<i>") are kept as they were: they decide the fitted sizes
            trials = (self._draft(task, budget, length, f"probe-{i}")[0] for i in itertools.count())
            self._sizes[key] = size_from_trials(task, length, budget, trials, self.counter)
        return self._sizes[key]

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
