"""Long inputs of a given token length: the built-in corpus or the user's own text files.

Nothing is downloaded. The default haystack is the built-in corpus of :mod:`headprobe.text.corpus` (prose
plus the retrieval-style documents the toy models are trained on); a user's own text files can be
given instead. Needle-in-a-haystack prompts are in :mod:`headprobe.text.needles`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from headprobe.core.paths import read_utf8
from headprobe.text.corpus import documents
from headprobe.text.files import TextFileError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (split after ``.``, ``!`` or ``?`` followed by whitespace)."""
    return [s for s in _SENTENCE_END.split(text.strip()) if s]


PROSE_ONLY = {"prose": 1.0}  # the built-in corpus without its task documents (facts, variables, questions)


def haystack_sentences(seed: int = 0, files: list[Path] | None = None, prose_only: bool = False) -> Iterator[str]:
    """An endless stream of sentences: the built-in corpus (``prose_only``: its prose documents alone, no
    planted facts or questions), or the given text files in a loop."""
    if files:
        texts = []
        for f in files:
            texts.append(read_utf8(f, "haystack file", FileNotFoundError))
        sentences = [s for t in texts for s in split_sentences(t)]
        if not sentences:
            raise TextFileError("the haystack files hold no text")
        while True:
            yield from sentences
    for _, text in documents(seed, mixture=PROSE_ONLY if prose_only else None):
        yield from split_sentences(text)


def filler_ids(tokenizer, length: int, seed: int = 0, files: list[Path] | None = None) -> list[int]:
    """Exactly ``length`` token ids of haystack text (the last sentence is cut)."""
    ids: list[int] = []
    for sentence in haystack_sentences(seed, files):
        ids.extend(tokenizer.encode(" " + sentence))
        if len(ids) >= length:
            return ids[:length]
    raise AssertionError("unreachable")


def text_inputs(
    tokenizer, length: int, samples: int, seed: int = 0, files: list[Path] | None = None, start: Sequence[int] = ()
) -> torch.Tensor:
    """``[samples, length]`` token ids for the attention-statistics metrics: ``start`` (the model's prompt
    start, :attr:`headprobe.hooked.base.HookedModel.prompt_start`), then haystack text; sample ``s``
    starts from a different part of the haystack."""
    start = list(start)
    rows = [
        start + filler_ids(tokenizer, length - len(start), seed=seed + 1000 * s, files=files) for s in range(samples)
    ]
    return torch.tensor(rows, dtype=torch.long)
