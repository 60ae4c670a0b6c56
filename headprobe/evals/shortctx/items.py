"""Multiple-choice items: loaders for the original files of ARC, HellaSwag, WinoGrande, RACE, PIQA,
OpenBookQA and CommonsenseQA (none is downloaded), a local JSONL format, and a small built-in set.

Each item offers choices as ``(context, continuation)`` pairs; :mod:`headprobe.evals.shortctx.scoring`
scores the continuation given the context.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headprobe.core.errors import HeadprobeError
from headprobe.core.paths import read_utf8
from headprobe.text.jsonl import jsonl_records
from headprobe.text.wordlists import words


class ShortCtxError(HeadprobeError, ValueError):
    """A task file is missing or not in the expected format."""


@dataclass(frozen=True)
class Item:
    """One question: choice ``i`` is the text ``pairs[i][0] + pairs[i][1]``, scored on ``pairs[i][1]``."""

    pairs: tuple[tuple[str, str], ...]
    label: int


def _lines(path: Path) -> list[dict[str, Any]]:
    text = read_utf8(path, "task file", ShortCtxError)
    out = [record for _, record in jsonl_records(text, path, ShortCtxError)]
    if not out:
        raise ShortCtxError(f"{path} holds no items")
    return out


def _field(record: dict, path: Path, *keys: str) -> Any:
    value: Any = record
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise ShortCtxError(f"{path}: an item lacks the field {'.'.join(keys)!r}; is this the right `task`?")
        value = value[key]
    return value


def load_jsonl(path: Path) -> list[Item]:
    """headprobe's format: ``{"context": str, "choices": [str, ...], "label": int}`` per line."""
    items = []
    for r in _lines(path):
        choices, label = _field(r, path, "choices"), _field(r, path, "label")
        if not isinstance(choices, list) or not (0 <= int(label) < len(choices)):
            raise ShortCtxError(f"{path}: label {label} is not an index into {len(choices)} choices")
        items.append(Item(tuple((_field(r, path, "context"), c) for c in choices), int(label)))
    return items


def _lettered(path: Path, question_format: str) -> list[Item]:
    """ARC / OpenBookQA / CommonsenseQA: ``question.stem``, ``question.choices[{label, text}]``, ``answerKey``."""
    items = []
    for r in _lines(path):
        stem = _field(r, path, "question", "stem")
        choices = _field(r, path, "question", "choices")
        labels = [c["label"] for c in choices]
        key = _field(r, path, "answerKey")
        if key not in labels:
            raise ShortCtxError(f"{path}: answerKey {key!r} is not among the choice labels {labels}")
        ctx = question_format.format(stem=stem)
        items.append(Item(tuple((ctx, " " + c["text"]) for c in choices), labels.index(key)))
    return items


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def load_hellaswag(path: Path) -> list[Item]:
    items = []
    for r in _lines(path):
        ctx = _field(r, path, "ctx_a") + " " + _field(r, path, "ctx_b").capitalize()
        query = _hellaswag_clean(_field(r, path, "activity_label") + ": " + ctx)
        endings = [_hellaswag_clean(e) for e in _field(r, path, "endings")]
        items.append(Item(tuple((query, " " + e) for e in endings), int(_field(r, path, "label"))))
    return items


def load_winogrande(path: Path) -> list[Item]:
    """Partial scoring: the option fills the blank in the context; the shared rest is scored."""
    items = []
    for r in _lines(path):
        sentence = _field(r, path, "sentence")
        at = sentence.index("_")
        continuation = " " + sentence[at + 1 :].strip()
        options = [_field(r, path, "option1"), _field(r, path, "option2")]
        items.append(
            Item(tuple((sentence[:at] + o, continuation) for o in options), int(_field(r, path, "answer")) - 1)
        )
    return items


def load_piqa(path: Path) -> list[Item]:
    """``valid.jsonl`` with its labels in ``valid-labels.lst`` beside it (or a ``label`` field)."""
    records = _lines(path)
    labels_file = path.with_name(path.stem + "-labels.lst")
    labels = labels_file.read_text().split() if labels_file.is_file() else [r.get("label") for r in records]
    if None in labels or len(labels) != len(records):
        raise ShortCtxError(f"{path}: PIQA labels not found (expected {labels_file.name} or a 'label' field)")
    return [
        Item(
            (
                (f"Question: {_field(r, path, 'goal')}\nAnswer:", " " + r["sol1"]),
                (f"Question: {r['goal']}\nAnswer:", " " + r["sol2"]),
            ),
            int(lab),
        )
        for r, lab in zip(records, labels, strict=True)
    ]


def load_race(path: Path) -> list[Item]:
    """RACE's original files: one JSON article per file (``article``, ``questions``, ``options``,
    ``answers`` as letters); ``path`` may be a file or a folder of them."""
    files = sorted(path.rglob("*.txt")) + sorted(path.rglob("*.json")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ShortCtxError(f"RACE data {path} does not exist")
    items = []
    for f in files:
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ShortCtxError(f"{f}: not valid JSON ({err.msg})") from None
        for q, opts, ans in zip(
            _field(doc, f, "questions"), _field(doc, f, "options"), _field(doc, f, "answers"), strict=True
        ):
            ctx = f"Article: {doc['article']}\n\nQuestion: {q}\nAnswer:"
            items.append(Item(tuple((ctx, " " + o) for o in opts), "ABCD".index(ans)))
    return items


LOADERS = {
    "jsonl": load_jsonl,
    "arc": lambda p: _lettered(p, "Question: {stem}\nAnswer:"),
    "openbookqa": lambda p: _lettered(p, "{stem}"),
    "commonsenseqa": lambda p: _lettered(p, "Question: {stem}\nAnswer:"),
    "hellaswag": load_hellaswag,
    "winogrande": load_winogrande,
    "piqa": load_piqa,
    "race": load_race,
}


def load_task(task: str, path: str | Path) -> list[Item]:
    if task not in LOADERS:
        raise ShortCtxError(f"unknown `task` {task!r}; choose one of {', '.join(LOADERS)} (or builtin)")
    return LOADERS[task](Path(path))


def builtin_items(n: int = 40, seed: int = 0) -> list[Item]:
    """A small generated multiple-choice set: recall a fact stated in the context, continue a counting
    sequence, repeat a word. Answerable by reading the context; for tests and the demo."""
    nouns = words("nouns")
    items = []
    for i in range(n):
        rng = random.Random(f"headprobe-mc-{seed}-{i}")
        kind = i % 3
        if kind == 0:
            key, value = rng.choice(nouns), rng.randrange(1000, 10000)
            wrong = rng.sample([v for v in range(1000, 10000) if v != value][:50], 3)
            ctx = f"The special code for the {key} is {value}. The special code for the {key} is"
            choices = [value, *wrong]
        elif kind == 1:
            start, step = rng.randrange(1, 50), rng.randrange(2, 6)
            seq = [start + step * j for j in range(5)]
            ctx = "Numbers: " + ", ".join(map(str, seq)) + ","
            nxt = seq[-1] + step
            choices = [nxt, nxt + 1, nxt - 1, nxt + step]
        else:
            word = rng.choice(nouns)
            ctx = f"Repeat the word: {word} {word} {word}"
            choices = [word, *rng.sample(nouns, 3)]
        order = list(range(4))
        rng.shuffle(order)
        items.append(Item(tuple((ctx, f" {choices[j]}") for j in order), order.index(0)))
    return items
