"""The held-out evaluation set: fixed token rows, never trained on, that every model of a grid is scored on,
so that its loss compares across members, runs and steps (a curriculum's training loss does not: it is the
loss on whatever level a run reached).

The rows are built from text alone, deterministically, in any tokenizer (:func:`eval_rows`); the same
tokenizer gives the same ids, so every member of a grid (one tokenizer) sees identical rows. Each row begins
with the end-of-text id, as training rows do, and its **targets** are the ids predicted from the ids before
them. Every target belongs to one of two splits:

``local`` (predictable within the toys' 8-token sliding window)
    * ``prose``: :data:`PROSE_DOCS` documents of the built-in prose (:class:`headprobe.text.corpus.Writer`,
      about :data:`PROSE_CHARS` characters each, drawn from a seed no training document uses); every id is a
      target.
    * ``list@0`` and ``copy@0``: :data:`LOCAL_SAMPLES` examples each of the ``list`` and ``copy`` tasks
      (:mod:`headprobe.text.tasks`) with no gap between a segment and its repeat; the targets are the
      task's (the repeat after its first word) whose evidence lies within :data:`LOCAL_REACH` tokens: the
      target id and the id before it occur, in that order, among the :data:`LOCAL_REACH` ids before it (an
      induction lookup inside the window finds it). Targets farther back are not counted at all.

``retrieval`` (only recoverable from beyond the window)
    * ``needle@500`` and ``needle@1500``: :data:`NEEDLE_SAMPLES` ``needle`` examples each, keys from the
      held-out half of the nouns, exactly 500 or 1,500 characters of prose between the facts and the
      question; the targets are the asked value's ids (its four digits with the space before them), which
      occur earlier in the row only in the fact that states them. 500 characters are about 140 tokens of the
      toys' BPE (500 of the byte tokenizer): beyond every sliding window of the toys; a model whose window
      reaches past the fact (the 0.6B and 3B grids' 512 tokens) can see it within its window.

A row's loss is summed over its targets; ``eval_loss`` pools every target of the set, ``eval_loss_local``
and ``eval_loss_retrieval`` the targets of one split, each in nats per target token
(:func:`headprobe.model.eval_loss.split_losses` computes them). The set is text, never a model run here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprobe.model.tokenizer import encode_spans
from headprobe.text.corpus import Writer
from headprobe.text.tasks import Split, Task, TaskMix, TaskSettings

if TYPE_CHECKING:
    from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer

LOCAL, RETRIEVAL = "local", "retrieval"
EVAL_SEED = 2_000_003  # examples that neither a training seed nor the task probes (1_000_003) draw
LOCAL_REACH = 8  # tokens: the toys' sliding window (headprobe.model.presets)
PROSE_DOCS, PROSE_CHARS = 8, 600
LOCAL_SAMPLES = 16
NEEDLE_SAMPLES = 16
NEEDLE_DISTANCES = (500, 1500)
# what decides the set's rows (with the tokenizer): a measurement of it is redone when this changes
SET_IDENTITY = (
    f"seed {EVAL_SEED}; prose {PROSE_DOCS} x {PROSE_CHARS} chars; list@0, copy@0 {LOCAL_SAMPLES} each, reach "
    f"{LOCAL_REACH}; needle@{'/'.join(map(str, NEEDLE_DISTANCES))} {NEEDLE_SAMPLES} each"
)


@dataclass(frozen=True)
class EvalRow:
    """One row of the set: ``ids`` (``[tokens]``, the end-of-text id first) and ``targets`` (``[tokens]``
    bool: whether id ``i`` counts, predicted from ``ids[:i]``; never the first), all in ``split``;
    ``section`` names its part of the set (``prose``, ``list@0``, ``needle@500``, ...)."""

    ids: tuple[int, ...]
    targets: tuple[bool, ...]
    split: str
    section: str


def _row(tokenizer: ByteTokenizer | HFTokenizer, text: str, spans: list[tuple[int, int]], split: str, section: str):
    """``text`` as a row whose targets are the ids overlapping ``spans`` (character ranges)."""
    ids, flags = encode_spans(tokenizer, text, spans)
    start = [] if tokenizer.eos_id is None else [tokenizer.eos_id]
    return EvalRow(tuple(start + ids), tuple([False] * len(start) + flags), split, section)


def within_reach(ids: tuple[int, ...], i: int, reach: int = LOCAL_REACH) -> bool:
    """Whether ``ids[i]`` is predictable by an induction lookup within ``reach`` tokens: some ``d`` in
    ``1..reach`` with ``ids[i - d] == ids[i]`` and ``ids[i - d - 1] == ids[i - 1]``."""
    return any(ids[i - d] == ids[i] and ids[i - d - 1] == ids[i - 1] for d in range(1, min(reach, i - 1) + 1))


def _local_copies(tokenizer: ByteTokenizer | HFTokenizer, task: Task) -> list[EvalRow]:
    """``LOCAL_SAMPLES`` ``task`` examples with no gap; only targets within :data:`LOCAL_REACH` count."""
    settings = TaskSettings(distance=(0, 0), segment=(8, 16), split=Split.HELDOUT)
    mix, rows = TaskMix({task: 1.0}, settings), []
    for i in range(LOCAL_SAMPLES):
        ex = mix.example(EVAL_SEED, i)
        row = _row(tokenizer, ex.text, list(ex.loss_spans), LOCAL, f"{task.value}@0")
        kept = tuple(t and within_reach(row.ids, j) for j, t in enumerate(row.targets))
        rows.append(EvalRow(row.ids, kept, LOCAL, row.section))
    return rows


def _needles(tokenizer: ByteTokenizer | HFTokenizer, distance: int) -> list[EvalRow]:
    settings = TaskSettings(distance=(distance, distance), pairs=(1, 3), queries=1, split=Split.HELDOUT)
    mix = TaskMix({Task.NEEDLE: 1.0}, settings)
    examples = (mix.example(EVAL_SEED, i) for i in range(NEEDLE_SAMPLES))
    return [_row(tokenizer, ex.text, list(ex.loss_spans), RETRIEVAL, f"needle@{distance}") for ex in examples]


def _prose(tokenizer: ByteTokenizer | HFTokenizer) -> list[EvalRow]:
    rows = []
    for i in range(PROSE_DOCS):
        text = " ".join(Writer(random.Random(f"headprobe-heldout-{EVAL_SEED}-{i}")).prose(PROSE_CHARS))
        rows.append(_row(tokenizer, text, [(0, len(text))], LOCAL, "prose"))
    return rows


def eval_rows(tokenizer: ByteTokenizer | HFTokenizer) -> tuple[EvalRow, ...]:
    """The held-out set in ``tokenizer``'s ids (see the module docstring): the ``prose``, ``list@0`` and
    ``copy@0`` rows (``local``), then the ``needle@500`` and ``needle@1500`` rows (``retrieval``). Building
    it takes milliseconds (a caller that scores often keeps the rows)."""
    rows = [*_prose(tokenizer), *_local_copies(tokenizer, Task.LIST), *_local_copies(tokenizer, Task.COPY)]
    for distance in NEEDLE_DISTANCES:
        rows += _needles(tokenizer, distance)
    return tuple(rows)
