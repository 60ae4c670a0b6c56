"""Offline texts for the analyses: long inputs of a given token length, and needle-in-a-haystack prompts.

Nothing is downloaded. The default haystack is the built-in corpus of :mod:`trainer.corpus` (prose
plus the retrieval-style documents the toy models are trained on); a user's own text files can be
given instead. Needles are our own sentences, each with a question and the answer span that Wu et
al.'s retrieval score tracks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.corpus import documents


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

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ``.``, ``!`` or ``?`` followed by whitespace)."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


def haystack_sentences(seed: int = 0, files: list[Path] | None = None) -> Iterator[str]:
    """An endless stream of sentences: the built-in corpus, or the given text files in a loop."""
    if files:
        texts = []
        for f in files:
            if not Path(f).is_file():
                raise FileNotFoundError(f"haystack file {f} does not exist")
            texts.append(Path(f).read_text(encoding="utf-8"))
        sentences = [s for t in texts for s in split_sentences(t)]
        if not sentences:
            raise ValueError("the haystack files hold no text")
        while True:
            yield from sentences
    for _, text in documents(seed):
        yield from split_sentences(text)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def filler_ids(tokenizer, length: int, seed: int = 0, files: list[Path] | None = None) -> list[int]:
    """Exactly ``length`` token ids of haystack text (the last sentence is cut)."""
    ids: list[int] = []
    for sentence in haystack_sentences(seed, files):
        ids.extend(_encode(tokenizer, " " + sentence))
        if len(ids) >= length:
            return ids[:length]
    raise AssertionError("unreachable")


def text_inputs(tokenizer, length: int, samples: int, seed: int = 0, files: list[Path] | None = None) -> torch.Tensor:
    """``[samples, length]`` token ids for the attention-statistics metrics (BOS first when the tokenizer
    has one); sample ``s`` starts from a different part of the haystack."""
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    rows = [bos + filler_ids(tokenizer, length - len(bos), seed=seed + 1000 * s, files=files) for s in range(samples)]
    return torch.tensor(rows, dtype=torch.long)


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
    tokenizer, needle: Needle, length: int, depth: float, seed: int = 0, files: list[Path] | None = None
) -> NeedlePrompt:
    """``length`` tokens: haystack sentences with ``needle`` inserted at ``depth`` percent (at a sentence
    boundary), then the question. Pieces are tokenised separately, so the answer's token span is exact."""
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    before = _encode(tokenizer, " " + needle.before)
    answer = _encode(tokenizer, needle.answer)
    after = _encode(tokenizer, needle.after)
    suffix = _encode(tokenizer, PROMPT_SUFFIX.format(question=needle.question))
    budget = length - len(bos) - len(before) - len(answer) - len(after) - len(suffix)
    if budget < 1:
        raise ValueError(f"length {length} is too short for the needle and question ({length - budget} tokens)")
    sentences: list[list[int]] = []
    used = 0
    for sentence in haystack_sentences(seed, files):
        piece = _encode(tokenizer, " " + sentence)
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
