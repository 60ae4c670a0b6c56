"""Needles for Wu et al.'s retrieval score, and needle-in-a-haystack prompts built around them.

Needles are our own sentences, each with a question and the answer span whose copying the retrieval
score tracks. The haystack around them comes from :mod:`headprobe.text.haystack`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from headprobe.text.haystack import haystack_sentences


@dataclass(frozen=True)
class Needle:
    """A fact to hide: ``before + answer + after`` is the inserted sentence; ``answer`` is the span
    whose copying is scored; ``question`` asks for it."""

    before: str
    answer: str
    after: str
    question: str

    @property
    def sentence(self) -> str:
        return self.before + self.answer + self.after


NEEDLES: tuple[Needle, ...] = (
    Needle(
        "The best thing to do in the harbour town of Vell is to ",
        "eat saffron mussels at the lighthouse cafe",
        ".",
        "What is the best thing to do in the harbour town of Vell?",
    ),
    Needle(
        "The secret ingredient in Grandmother Orla's plum cake is ",
        "a spoonful of black pepper",
        ".",
        "What is the secret ingredient in Grandmother Orla's plum cake?",
    ),
    Needle(
        "The observatory on Mount Kesh was paid for by ",
        "a retired tram conductor named Ilse Marrow",
        ".",
        "Who paid for the observatory on Mount Kesh?",
    ),
    Needle(
        "The password to the archive in the old mill is ",
        "amber falcon seventeen",
        ".",
        "What is the password to the archive in the old mill?",
    ),
    Needle(
        "Every winter the fishermen of Lorne paint their boats ",
        "bright turquoise with white stripes",
        ".",
        "How do the fishermen of Lorne paint their boats every winter?",
    ),
)

PROMPT_SUFFIX = "\nBased on the content of the book, Question: {question}\nAnswer:"


@dataclass(frozen=True)
class NeedlePrompt:
    """A needle-in-a-haystack prompt as token ids, with where the answer sits."""

    ids: list[int]
    answer_start: int
    answer_end: int
    needle: Needle
    depth: float
    haystack: str

    @property
    def length(self) -> int:
        return len(self.ids)


def needle_prompt(
    tokenizer,
    needle: Needle,
    length: int,
    depth: float,
    seed: int = 0,
    files: list[Path] | None = None,
    start: Sequence[int] = (),
) -> NeedlePrompt:
    """``length`` tokens: ``start`` (the model's prompt start), haystack sentences with ``needle`` inserted
    at ``depth`` percent (at a sentence boundary), then the question. Pieces are tokenised separately,
    so the answer's token span is exact."""
    bos = list(start)
    before = tokenizer.encode(" " + needle.before)
    answer = tokenizer.encode(needle.answer)
    after = tokenizer.encode(needle.after)
    suffix = tokenizer.encode(PROMPT_SUFFIX.format(question=needle.question))
    budget = length - len(bos) - len(before) - len(answer) - len(after) - len(suffix)
    if budget < 1:
        raise ValueError(f"length {length} is too short for the needle and question ({length - budget} tokens)")
    sentences: list[list[int]] = []
    used = 0
    for sentence in haystack_sentences(seed, files):
        piece = tokenizer.encode(" " + sentence)
        if used + len(piece) > budget:
            piece = piece[: budget - used]
        sentences.append(piece)
        used += len(piece)
        if used >= budget:
            break
    cut = round(len(sentences) * depth / 100)
    head = [t for s in sentences[:cut] for t in s]
    tail = [t for s in sentences[cut:] for t in s]
    ids = bos + head + before + answer + after + tail + suffix
    start = len(bos) + len(head) + len(before)
    source = "builtin" if not files else ",".join(str(f) for f in files)
    return NeedlePrompt(ids, start, start + len(answer), needle, depth, source)
