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


def _numbered(path: Path) -> list[tuple[int, Any]]:
    """The items of a JSON-lines task file with their line numbers."""
    text = read_utf8(path, "task file", ShortCtxError)
    out = list(jsonl_records(text, path, ShortCtxError))
    if not out:
        raise ShortCtxError(f"{path} holds no items")
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in _numbered(path)]


def _field(record: dict, path: Path, *keys: str, line: int | None = None) -> Any:
    value: Any = record
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            where = f"{path} line {line}" if line is not None else str(path)
            raise ShortCtxError(f"{where}: an item lacks the field {'.'.join(keys)!r}; is this the right `task`?")
        value = value[key]
    return value


def _kind(value: Any) -> str:
    """What a JSON value is, as a message says it: ``null``, ``a number (5)``, ``a string ("ab")``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({json.dumps(value)})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    shown = json.dumps(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{'a string' if isinstance(value, str) else 'a list' if isinstance(value, list) else 'an object'} ({shown})"


class _Item:
    """One item of a task file, read field by field: each refusal names the file, the line and the field,
    what it holds and what to give instead."""

    def __init__(self, path: Path, line: int, record: Any, example: str) -> None:
        self.where, self.record, self.example = f"{path} line {line}", record, example
        self.path, self.line = path, line
        if not isinstance(record, dict):
            raise ShortCtxError(f"{self.where}: an item is a JSON object, got {_kind(record)}; write e.g. {example}")

    def refuse(self, field: str, problem: str, fix: str) -> ShortCtxError:
        return ShortCtxError(f"{self.where}: {field!r} {problem}; {fix} (an item: {self.example})")

    def text(self, *keys: str) -> str:
        value = _field(self.record, self.path, *keys, line=self.line)
        if not isinstance(value, str):
            raise self.refuse(".".join(keys), f"is {_kind(value)}, not text", "give it as a JSON string")
        return value

    def texts(self, key: str) -> list[str]:
        value = _field(self.record, self.path, key, line=self.line)
        fix = "give a list of the choices as JSON strings"
        if not isinstance(value, list):
            raise self.refuse(key, f"is {_kind(value)}, not a list", fix)
        if not value:
            raise self.refuse(key, "is an empty list", fix)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise self.refuse(key, f"item {i} is {_kind(item)}, not text", "give every choice as a JSON string")
        return value

    def index(self, key: str, n: int, base: int = 0, digits: bool = False) -> int:
        """The field ``key``: a whole number from ``base`` to ``base + n - 1`` (a JSON number; with ``digits``
        also a string of digits, as WinoGrande stores it), returned 0-based."""
        value = _field(self.record, self.path, key, line=self.line)
        number = value
        spelled = digits and isinstance(value, str) and value.strip().isdigit()
        if spelled or (isinstance(value, float) and value.is_integer()):
            number = int(value)
        fix = f"give the {base}-based index of the right choice, a whole number from {base} to {base + n - 1}"
        if isinstance(number, bool) or not isinstance(number, int):
            raise self.refuse(key, f"is {_kind(value)}, not a whole number", fix)
        if not base <= number < base + n:
            raise self.refuse(key, f"is {number}, not an index into the {n} choices", fix)
        return number - base


JSONL_EXAMPLE = '{"context": "2+2=", "choices": [" 4", " 5"], "label": 0}'


def load_jsonl(path: Path) -> list[Item]:
    """headprobe's format: ``{"context": str, "choices": [str, ...], "label": int}`` per line; every field is
    checked, a wrong one refused naming the file, the line and the field."""
    items = []
    for line, r in _numbered(path):
        item = _Item(path, line, r, JSONL_EXAMPLE)
        context, choices = item.text("context"), item.texts("choices")
        items.append(Item(tuple((context, c) for c in choices), item.index("label", len(choices))))
    return items


def _lettered(path: Path, question_format: str) -> list[Item]:
    """ARC / OpenBookQA / CommonsenseQA: ``question.stem``, ``question.choices[{label, text}]``, ``answerKey``."""
    example = '{"question": {"stem": "...", "choices": [{"label": "A", "text": "..."}, ...]}, "answerKey": "A"}'
    items = []
    for line, r in _numbered(path):
        item = _Item(path, line, r, example)
        stem = item.text("question", "stem")
        choices = _field(r, path, "question", "choices", line=line)
        if not isinstance(choices, list) or not all(
            isinstance(c, dict) and isinstance(c.get("label"), str) and isinstance(c.get("text"), str) for c in choices
        ):
            raise item.refuse(
                "question.choices", f"is {_kind(choices)}", 'give a list of {"label": "A", "text": "..."} objects'
            )
        labels = [c["label"] for c in choices]
        key = _field(r, path, "answerKey", line=line)
        if key not in labels:
            raise ShortCtxError(f"{item.where}: answerKey {key!r} is not among the choice labels {labels}")
        ctx = question_format.format(stem=stem)
        items.append(Item(tuple((ctx, " " + c["text"]) for c in choices), labels.index(key)))
    return items


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def load_hellaswag(path: Path) -> list[Item]:
    example = '{"activity_label": "...", "ctx_a": "...", "ctx_b": "...", "endings": ["...", ...], "label": 0}'
    items = []
    for line, r in _numbered(path):
        item = _Item(path, line, r, example)
        ctx = item.text("ctx_a") + " " + item.text("ctx_b").capitalize()
        query = _hellaswag_clean(item.text("activity_label") + ": " + ctx)
        endings = [_hellaswag_clean(e) for e in item.texts("endings")]
        items.append(Item(tuple((query, " " + e) for e in endings), item.index("label", len(endings))))
    return items


def load_winogrande(path: Path) -> list[Item]:
    """Partial scoring: the option fills the blank in the context; the shared rest is scored."""
    example = '{"sentence": "... _ ...", "option1": "...", "option2": "...", "answer": "1"}'
    items = []
    for line, r in _numbered(path):
        item = _Item(path, line, r, example)
        sentence = item.text("sentence")
        if "_" not in sentence:
            raise item.refuse("sentence", "has no blank (_)", "mark where the option goes with _")
        at = sentence.index("_")
        continuation = " " + sentence[at + 1 :].strip()
        options = [item.text("option1"), item.text("option2")]
        answer = item.index("answer", 2, base=1, digits=True)
        items.append(Item(tuple((sentence[:at] + o, continuation) for o in options), answer))
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
