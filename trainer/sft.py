"""Supervised fine-tuning data: prompt/response pairs, the built-in instruction set, loss masks.

A JSONL file has one object per line with string fields ``prompt`` and ``response``. An example is
tokenised as ``prompt + response + <eos>``; the loss covers the response tokens and the final
``<eos>`` only (the prompt is context, not a target). Examples longer than ``seq_len + 1`` tokens
lose prompt tokens from the left first, so the response is kept.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from headprobe.core.paths import read_utf8
from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.text.corpus import GENERATORS, Writer
from headprobe.text.jsonl import jsonl_records
from headprobe.text.wordlists import words
from trainer.data import DataError


@dataclass(frozen=True)
class Example:
    prompt: str
    response: str


def load_jsonl(path: str | Path) -> list[Example]:
    path = Path(path)
    text = read_utf8(path, "SFT file", DataError)
    out = []
    for lineno, rec in jsonl_records(text, path, DataError):
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("prompt"), str)
            or not isinstance(rec.get("response"), str)
        ):
            raise DataError(f"{path}:{lineno}: expected an object with string fields 'prompt' and 'response'")
        if not rec["response"]:
            raise DataError(f"{path}:{lineno}: empty response (nothing to learn from)")
        out.append(Example(rec["prompt"], rec["response"]))
    if not out:
        raise DataError(f"SFT file {path} holds no examples")
    return out


def _split_question(doc: str) -> Example:
    """Corpus documents end in '... Question: ... Answer: <answer>'; the answer becomes the response."""
    head, _, answer = doc.rpartition(" Answer: ")
    return Example(head + " Answer:", " " + answer)


def builtin_examples(n: int, seed: int = 0) -> list[Example]:
    """``n`` generated instruction examples: recall a key's value, trace a variable chain, name the
    most common words (from :mod:`headprobe.text.corpus`), and copy or reverse a word list."""
    nouns = words("nouns")
    out = []
    for i in range(n):
        rng = random.Random(f"headprobe-sft-{seed}-{i}")
        kind = rng.choice(["kv_recall", "var_chain", "word_count", "copy", "reverse"])
        if kind in ("copy", "reverse"):
            items = rng.sample(nouns, rng.randrange(3, 12))
            verb = "Repeat these words in order" if kind == "copy" else "Write these words in reverse order"
            answer = items if kind == "copy" else items[::-1]
            out.append(Example(f"{verb}: {' '.join(items)}. Answer:", " " + " ".join(answer) + "."))
        else:
            out.append(_split_question(GENERATORS[kind](Writer(rng))))
    return out


def encode(example: Example, tokenizer: ByteTokenizer | HFTokenizer, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, loss_mask)`` of length ``<= seq_len + 1``; ``loss_mask[j]`` says whether token ``j``
    is a target (a response token or the final ``<eos>``)."""
    if tokenizer.eos_id is None:
        raise DataError(f"tokenizer {tokenizer.name} has no end-of-sequence token")
    prompt = tokenizer.encode(example.prompt)
    response = [*tokenizer.encode(example.response), tokenizer.eos_id]
    limit = seq_len + 1
    if len(response) >= limit:  # keep at least one prompt token as context
        prompt, response = prompt[-1:], response[: limit - 1]
    elif len(prompt) + len(response) > limit:
        prompt = prompt[len(prompt) + len(response) - limit :]
    tokens = np.asarray(prompt + response, dtype=np.int64)
    mask = np.zeros(len(tokens), dtype=bool)
    mask[len(prompt) :] = True
    return tokens, mask


class SftData:
    """Tokenised examples; item ``i`` is ``(tokens, loss_mask)``."""

    def __init__(self, examples: list[Example], tokenizer: ByteTokenizer | HFTokenizer, seq_len: int) -> None:
        self.items = [encode(e, tokenizer, seq_len) for e in examples]
        self.pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else tokenizer.eos_id

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.items[i]
