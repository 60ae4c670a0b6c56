"""Synthetic retrieval tasks for training and probing: documents with the character spans their loss counts.

Every generator returns a :class:`TaskExample`: a text and the spans ``[start, end)`` whose tokens are
targets (the rest is context); :func:`headprobe.model.tokenizer.encode_spans` turns them into a
per-token loss mask for any tokenizer. Distances are in characters (tokens for the byte tokenizer).

=============  ============================================================================================
``copy``       prose, a segment, a gap of prose, the segment again; the loss counts the repeat after its
               first word (the cue: nothing else tells that a repeat begins)
``recall``     multi-query associative recall: key-value pairs, prose, then some keys again with their
               values; the loss counts the recalled values
``needle``     prose holding facts ("The code for the red cup is 4471."), more prose, a question answered
               answered by restating the fact ("Answer: The code for the red cup is 4471."); the loss
               counts the value only (the restatement is context, as RULER's answer prefixes are)
``magic``      RULER's needle phrasing ("One of the special magic numbers for shaky-seeker is: 2461937.")
               in our prose, asked with RULER's question and answer prefix; the loss counts the number
``list``       random nouns (each 1-4 tokens of a BPE, thousands to choose from), a gap of prose, the same
               nouns again; the loss counts the repeat after its first noun. A copy warm-up with few
               look-alikes: in a packed row a noun seldom occurs in another example, whereas digits,
               symbols and prose words occur everywhere and make "find the earlier occurrence" ambiguous
``repeat``     a string of random symbols (digits and letters) repeated at once, nothing between; the loss
               counts the repeat after its first symbol: exact copying of what nothing else predicts
``prose``      the built-in corpus' prose; every token counts
=============  ============================================================================================

Keys are drawn from one half of the noun list (``split="train"``) or the other (``split="heldout"``),
so a probe can ask about facts whose keys never occurred in training. Everything is deterministic in
``(seed, index)``.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache

from headprobe.core.choice import Choice
from headprobe.core.errors import HeadprobeError
from headprobe.core.settings import check_ranges, setting
from headprobe.text.corpus import Writer
from headprobe.text.wordlists import words


class TaskError(HeadprobeError, ValueError):
    """Task settings or a task mix (``tasks``) that cannot be used."""


class Task(Choice, what="task"):
    COPY = "copy"
    RECALL = "recall"
    NEEDLE = "needle"
    MAGIC = "magic"
    LIST = "list"
    REPEAT = "repeat"
    PROSE = "prose"


class Split(Choice, what="split"):
    TRAIN = "train"
    HELDOUT = "heldout"


@dataclass(frozen=True)
class TaskExample:
    """A document and the character spans ``[start, end)`` its loss counts (none: every token counts)."""

    text: str
    loss_spans: tuple[tuple[int, int], ...] = ()
    kind: str = "prose"


@dataclass(frozen=True)
class TaskSettings:
    """How a task's documents are drawn.

    Attributes:
        distance: ``(min, max)`` characters between what is to be retrieved and where it is asked for.
        segment: ``(min, max)`` characters of a copied segment (``copy``).
        pairs: ``(min, max)`` key-value pairs (``recall``) or facts (``needle``) per document.
        queries: how many keys are asked about (``recall``; ``needle`` asks about one).
        split: which half of the nouns keys come from.
    """

    distance: tuple[int, int] = setting((0, 256), minimum=0)
    segment: tuple[int, int] = setting((16, 48), minimum=0)
    pairs: tuple[int, int] = setting((1, 4), minimum=1)
    queries: int = setting(2, minimum=1)
    split: Split = Split.TRAIN

    def __post_init__(self) -> None:
        check_ranges(self, TaskError)
        for name in ("distance", "segment", "pairs"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise TaskError(f"`{name}` {lo}:{hi}: give MIN:MAX with MIN at most MAX")
        object.__setattr__(self, "split", Split(self.split))


@cache
def keys(split: Split) -> tuple[str, ...]:
    """The nouns keys are drawn from: the even-numbered ones for ``train``, the odd for ``heldout``."""
    nouns = words("nouns")
    return nouns[0::2] if split is Split.TRAIN else nouns[1::2]


def _prose(w: Writer, n_chars: int) -> str:
    """About ``n_chars`` characters of prose (whole sentences, cut to length)."""
    if n_chars <= 0:
        return ""
    return " ".join(w.prose(n_chars))[:n_chars]


def _key(w: Writer, split: Split) -> str:
    return f"{w.rng.choice(w.adjs)} {w.rng.choice(keys(split))}"


def _value(w: Writer) -> str:
    return str(w.rng.randrange(1000, 10000))


def _item(w: Writer) -> str:
    """A random noun or, one time in three, a number: copying must work for digits too (the values of
    recall and needles), or a copy circuit learned on words never moves a digit."""
    return _value(w) if w.rng.random() < 1 / 3 else w.rng.choice(w.nouns)


def copy_example(w: Writer, s: TaskSettings) -> TaskExample:
    n_chars = w.rng.randint(*s.segment)
    segment = _prose(w, n_chars).strip()
    if w.rng.random() < 0.5 or " " not in segment:  # random words: nothing to predict but by copying
        picked = [_item(w), _item(w)]
        while len(" ".join(picked)) < n_chars:
            picked.append(_item(w))
        if len(picked) > 2 and len(" ".join(picked)) > n_chars:
            picked.pop()
        segment = " ".join(picked)  # at least two words; longer than n_chars only when two are
    # prose before the segment: it starts anywhere, so "repeat the document's start" is no solution
    lead = _prose(w, w.rng.randint(0, max(16, s.distance[1] // 4))).strip()
    gap = _prose(w, w.rng.randint(*s.distance))
    text = " ".join(part for part in (lead, segment, gap, segment) if part)
    # the repeat's first word is the cue (nothing tells a repeat begins); the loss counts the rest
    start = len(text) - len(segment) + segment.index(" ")
    return TaskExample(text, ((start, len(text)),), "copy")


def list_example(w: Writer, s: TaskSettings) -> TaskExample:
    n_chars = w.rng.randint(*s.segment)
    picked = [w.rng.choice(w.nouns), w.rng.choice(w.nouns)]
    while len(" ".join(picked)) < n_chars:
        picked.append(w.rng.choice(w.nouns))
    segment = " ".join(picked)
    gap = _prose(w, w.rng.randint(*s.distance)).strip()
    text = " ".join(part for part in (segment, gap, segment) if part)
    start = len(text) - len(segment) + segment.index(" ")  # the repeat's first noun is its cue
    return TaskExample(text, ((start, len(text)),), "list")


def recall_example(w: Writer, s: TaskSettings) -> TaskExample:
    n = w.rng.randint(*s.pairs)
    pairs: dict[str, str] = {}
    while len(pairs) < n:
        pairs.setdefault(_key(w, s.split), _value(w))
    asked = w.rng.sample(list(pairs), min(s.queries, n))
    text = "Pairs: " + ", ".join(f"{k} {v}" for k, v in pairs.items()) + ". " + _prose(w, w.rng.randint(*s.distance))
    text += " Recall:"
    spans = []
    for k in asked:
        text += f" {k}"
        spans.append((len(text), len(text) + len(pairs[k]) + 1))
        text += f" {pairs[k]},"
    return TaskExample(text[:-1] + ".", tuple(spans), "recall")


def needle_fact(key: str, value: str) -> str:
    return f"The code for the {key} is {value}."


def needle_question(key: str) -> str:
    return f"Question: What is the code for the {key}? Answer:"


def _fact_example(
    w: Writer, s: TaskSettings, draw: Callable[[], tuple[str, str]], fact: Callable[[str, str], str],
    ask: Callable[[str], str], kind: str,
) -> TaskExample:  # fmt: skip
    """Prose holding ``pairs`` facts (``draw()`` gives a key and its value, ``fact`` words them), ``distance``
    characters more prose, then ``ask(key)`` about one of them; the loss counts its value."""
    n = w.rng.randint(*s.pairs)
    facts: dict[str, str] = {}
    while len(facts) < n:
        key, value = draw()
        facts.setdefault(key, value)
    key = w.rng.choice(list(facts))
    body = " ".join(f"{_prose(w, w.rng.randint(0, 64))} {fact(k, v)}".strip() for k, v in facts.items())
    text = f"{body} {_prose(w, w.rng.randint(*s.distance))} {ask(key)}"
    start = len(text)
    text += f" {facts[key]}."
    return TaskExample(text, ((start, start + len(facts[key]) + 1),), kind)


def needle_example(w: Writer, s: TaskSettings) -> TaskExample:
    # the answer restates the fact (context), then gives its value
    return _fact_example(
        w, s, lambda: (_key(w, s.split), _value(w)), needle_fact,
        lambda key: f"{needle_question(key)} The code for the {key} is", "needle",
    )  # fmt: skip


MAGIC_FACT = "One of the special magic numbers for {key} is: {value}."  # RULER's niah needle and question
MAGIC_QUESTION = (
    "What are all the special magic numbers for {key} mentioned in the provided text? "
    "The special magic numbers for {key} mentioned in the provided text are"
)


def magic_example(w: Writer, s: TaskSettings) -> TaskExample:
    return _fact_example(
        w, s, lambda: (_key(w, s.split).replace(" ", "-"), str(w.rng.randint(10**6, 10**7 - 1))),
        lambda k, v: MAGIC_FACT.format(key=k, value=v), lambda key: MAGIC_QUESTION.format(key=key), "magic",
    )  # fmt: skip


SYMBOLS = string.digits + string.ascii_letters + "+/"  # 64 symbols


def repeat_example(w: Writer, s: TaskSettings) -> TaskExample:
    n = max(2, w.rng.randint(*s.segment))
    segment = "".join(w.rng.choice(SYMBOLS) for _ in range(n))
    return TaskExample(segment + segment, ((n + 1, 2 * n),), "repeat")


def prose_example(w: Writer, s: TaskSettings) -> TaskExample:
    return TaskExample(_prose(w, w.rng.randint(200, 2000)).strip() or "The cup.", (), "prose")


GENERATORS = {
    Task.COPY: copy_example,
    Task.RECALL: recall_example,
    Task.NEEDLE: needle_example,
    Task.MAGIC: magic_example,
    Task.LIST: list_example,
    Task.REPEAT: repeat_example,
    Task.PROSE: prose_example,
}


@dataclass(frozen=True)
class TaskMix:
    """A mixture of tasks by weight (by document count), each with its settings."""

    weights: dict[Task, float] = field(default_factory=lambda: {Task.COPY: 1.0})
    settings: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self) -> None:
        weights = {Task(k): float(v) for k, v in self.weights.items()}
        if not weights or min(weights.values()) < 0 or sum(weights.values()) <= 0:
            raise TaskError("a task mix needs non-negative weights that are not all zero")
        object.__setattr__(self, "weights", weights)

    @classmethod
    def parse(cls, spec: str, settings: TaskSettings | None = None) -> TaskMix:
        """``"copy"`` or ``"copy=1,needle=2,prose=1"`` (weights by document count)."""
        weights: dict[Task, float] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            name, _, weight = part.partition("=")
            try:
                weights[Task(name.strip())] = float(weight) if weight else 1.0
            except ValueError as err:
                raise TaskError(f"`tasks` {spec!r}: {err}") from None
        return cls(weights, settings or TaskSettings())

    def describe(self) -> dict[str, object]:
        """JSON-ready: the weights and settings (recorded with data generated from the mix)."""
        s = self.settings
        return {
            "weights": {t.value: w for t, w in self.weights.items()},
            "settings": {
                "distance": list(s.distance),
                "segment": list(s.segment),
                "pairs": list(s.pairs),
                "queries": s.queries,
                "split": s.split.value,
            },
        }

    def example(self, seed: int, index: int) -> TaskExample:
        """Document ``index`` of the mix with ``seed``."""
        rng = random.Random(f"headprobe-task-{seed}-{index}")
        task = rng.choices(list(self.weights), weights=list(self.weights.values()))[0]
        return GENERATORS[task](Writer(rng), self.settings)

    def examples(self, seed: int, start: int = 0) -> Iterator[TaskExample]:
        index = start
        while True:
            yield self.example(seed, index)
            index += 1
