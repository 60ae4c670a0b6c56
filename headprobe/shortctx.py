"""Short-context multiple-choice evaluation by log-likelihood, as lm-evaluation-harness scores it.

Each item offers choices as ``(context, continuation)`` pairs; the model's score of a choice is the
summed log-probability of the continuation's tokens given the context. ``acc`` picks the largest
sum; ``acc_norm`` divides each sum by the continuation's length in characters first (lm-eval's
length normalisation).

Data: a local JSONL format (``{"context", "choices", "label"}``: choice ``c`` is the pair
``(context, c)``), loaders for the original files of ARC, HellaSwag, WinoGrande, RACE, PIQA,
OpenBookQA and CommonsenseQA (none is downloaded), and a small built-in set. ``HeadprobeLM`` adapts
any headprobe model to lm-evaluation-harness' ``LM`` interface.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headprobe.model.tokenizer import prompt_start, with_prompt_start
from headprobe.probe import ProbedModel
from headprobe.text.jsonl import jsonl_records


class ShortCtxError(ValueError):
    """A task file is missing or not in the expected format."""


@dataclass(frozen=True)
class Item:
    """One question: choice ``i`` is the text ``pairs[i][0] + pairs[i][1]``, scored on ``pairs[i][1]``."""

    pairs: tuple[tuple[str, str], ...]
    label: int


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------
def _logits(model: ProbedModel, ids: list[int]) -> torch.Tensor:
    """Log-softmax over the vocabulary for every position of ``ids`` (``[len, vocab]``)."""
    return torch.log_softmax(model.logits(torch.tensor([ids]))[0].double(), dim=-1)


def _pair_ids(model: ProbedModel, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context and continuation token ids, tokenised separately (as lm-eval does)."""
    tok = model.tokenizer
    ctx = with_prompt_start(tok, tok.encode(context))
    cont = tok.encode(continuation)
    if not cont:
        raise ShortCtxError(f"continuation {continuation!r} has no tokens")
    if not ctx:  # lm-eval: start from the end-of-text token when there is no context
        ctx = [tok.eos_id if tok.eos_id is not None else cont[0]]
    return ctx, cont


LOGIT_BUDGET = 1 << 27  # float32 logits held at once by a batch (batch x length x vocab), 512 MiB


def loglikelihoods(
    model: ProbedModel, pairs: list[tuple[str, str]], batch_size: int = 16, progress: bool = False
) -> list[tuple[float, bool]]:
    """``(sum of log p(continuation tokens | context), whether greedy decoding would produce them)`` for
    each ``(context, continuation)`` pair.

    Context and continuation are tokenised separately and concatenated, as lm-eval does, so the
    continuation's tokens are exactly those scored. Sequences of similar length run together, padded on
    the right: attention is causal, so padding after a sequence never changes its logits. A batch holds
    at most ``batch_size`` sequences and ``LOGIT_BUDGET`` logits.
    """
    from tqdm.auto import tqdm

    encoded = [_pair_ids(model, c, x) for c, x in pairs]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]) - len(encoded[i][1]))
    vocab = None
    out: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    bar = tqdm(total=len(encoded), disable=not progress, desc="loglikelihood")
    start = 0
    while start < len(order):
        longest = len(encoded[order[start]][0]) + len(encoded[order[start]][1])
        fits = max(1, LOGIT_BUDGET // (longest * vocab)) if vocab else 1
        chunk = order[start : start + min(batch_size, fits)]
        ids = torch.zeros(len(chunk), longest, dtype=torch.long)
        for row, i in enumerate(chunk):
            seq = encoded[i][0] + encoded[i][1]
            ids[row, : len(seq)] = torch.tensor(seq)
        logits = model.logits(ids)  # [rows, longest, vocab]
        vocab = logits.shape[-1]
        for row, i in enumerate(chunk):
            ctx, cont = encoded[i]
            picked = torch.log_softmax(logits[row, len(ctx) - 1 : len(ctx) - 1 + len(cont)].double(), dim=-1)
            target = torch.tensor(cont, device=picked.device)
            out[i] = (float(picked.gather(-1, target[:, None]).sum()), bool((picked.argmax(-1) == target).all()))
        bar.update(len(chunk))
        start += len(chunk)
    bar.close()
    return out


def loglikelihood(model: ProbedModel, context: str, continuation: str) -> tuple[float, bool]:
    """One pair's :func:`loglikelihoods`."""
    return loglikelihoods(model, [(context, continuation)])[0]


def evaluate_items(
    model: ProbedModel, items: Iterable[Item], progress: bool = False, batch_size: int = 16
) -> dict[str, Any]:
    """``acc`` and ``acc_norm`` (0-1) over ``items``, with per-item predictions."""
    items = list(items)
    if not items:
        raise ShortCtxError("no items to evaluate")
    scored = iter(loglikelihoods(model, [p for item in items for p in item.pairs], batch_size, progress))
    correct = correct_norm = 0
    rows = []
    for item in items:
        sums = [next(scored)[0] for _ in item.pairs]
        norm = [s / max(1, len(x)) for s, (_, x) in zip(sums, item.pairs, strict=True)]
        pred, pred_norm = max(range(len(sums)), key=sums.__getitem__), max(range(len(norm)), key=norm.__getitem__)
        correct += pred == item.label
        correct_norm += pred_norm == item.label
        rows.append({"label": item.label, "pred": pred, "pred_norm": pred_norm, "loglikelihoods": sums})
    return {"acc": correct / len(items), "acc_norm": correct_norm / len(items), "n": len(items), "items": rows}


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------
def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ShortCtxError(f"task file {path} does not exist")
    out = [record for _, record in jsonl_records(path.read_text(encoding="utf-8"), path, ShortCtxError)]
    if not out:
        raise ShortCtxError(f"{path} holds no items")
    return out


def _field(record: dict, path: Path, *keys: str) -> Any:
    value: Any = record
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            raise ShortCtxError(f"{path}: an item lacks the field {'.'.join(keys)!r}; is this the right --task?")
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
        raise ShortCtxError(f"unknown task {task!r}; choose one of {', '.join(LOADERS)} (or builtin)")
    return LOADERS[task](Path(path))


def builtin_items(n: int = 40, seed: int = 0) -> list[Item]:
    """A small generated multiple-choice set: recall a fact stated in the context, continue a counting
    sequence, repeat a word. Answerable by reading the context; for tests and the demo."""
    from headprobe.text.wordlists import words

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


# ---------------------------------------------------------------------------------------------
# lm-evaluation-harness adapter
# ---------------------------------------------------------------------------------------------
def _lm_base():
    try:
        from lm_eval.api.model import LM
    except ImportError:  # lm-eval not installed: a plain base class keeps the adapter importable
        return object
    return LM


class HeadprobeLM(_lm_base()):  # type: ignore[misc]
    """lm-evaluation-harness ``LM`` over a headprobe model: ``lm_eval.simple_evaluate(model=HeadprobeLM(path),
    tasks=[...])`` runs any of its tasks on our checkpoints (or local HF models) offline."""

    def __init__(
        self,
        path: str | Path | None = None,
        model: ProbedModel | None = None,
        device: str = "cpu",
        batch_size: int = 8,
    ) -> None:
        if model is None and path is None:
            raise ValueError("give a checkpoint path or a loaded model")
        if _lm_base() is not object:
            super().__init__()
        if model is None:
            from headprobe.probe import load_model

            model = load_model(path, device=device)  # type: ignore[arg-type]
        self.probed = model
        self.batch_size = max(1, int(batch_size))

    @staticmethod
    def _args(request) -> tuple:
        return tuple(request.args) if hasattr(request, "args") else tuple(request)

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        return loglikelihoods(self.probed, [self._args(r)[:2] for r in requests], self.batch_size)

    def loglikelihood_rolling(self, requests) -> list[float]:
        """Log-likelihood of each whole text (token by token from the start, one window)."""
        out = []
        for r in requests:
            text = self._args(r)[0]
            ids = with_prompt_start(self.probed.tokenizer, self.probed.tokenizer.encode(text))
            if not prompt_start(self.probed.tokenizer):  # no BOS: condition the first token on end-of-text
                eos = self.probed.tokenizer.eos_id
                ids = [eos if eos is not None else ids[0], *ids]
            logp = _logits(self.probed, ids)
            target = torch.tensor(ids[1:], device=logp.device)
            out.append(float(logp[:-1].gather(-1, target[:, None]).sum()))
        return out

    def generate_until(self, requests) -> list[str]:
        """Greedy continuations cut at the first ``until`` string; requests with the same
        ``max_gen_toks`` decode together, ``batch_size`` at a time (:meth:`ProbedModel.decode_batch`)."""
        tok = self.probed.tokenizer
        stop = [tok.eos_id] if tok.eos_id is not None else None
        args = [self._args(r)[:2] for r in requests]
        out = [""] * len(args)
        groups: dict[int, list[int]] = {}
        for i, (_, kwargs) in enumerate(args):
            groups.setdefault(int(kwargs.get("max_gen_toks", 256)), []).append(i)
        for max_new, members in groups.items():
            for start in range(0, len(members), self.batch_size):
                chunk = members[start : start + self.batch_size]
                prompts = [torch.tensor([with_prompt_start(tok, tok.encode(args[i][0]))]) for i in chunk]
                for i, new in zip(chunk, self.probed.decode_batch(prompts, max_new, stop), strict=True):
                    until = args[i][1].get("until", []) or []
                    text = tok.decode(new)
                    for s in [until] if isinstance(until, str) else until:
                        text = text.split(s)[0]
                    out[i] = text
        return out
