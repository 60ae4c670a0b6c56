"""Task probes: held-out retrieval accuracy of our models at chosen distances (the trainer logs them to
``metrics.jsonl`` during training; ``headprobe study`` measures every finished run with them).

A probe ``task@distance`` (``needle@1000``, ``recall@500``, ``copy@300``) draws examples of that task
with keys from the held-out half of the nouns (:mod:`headprobe.text.tasks`) and exactly ``distance``
characters between what is to be retrieved and where it is asked for; the prompt is the text up to the
answer (for ``needle``: up to the value, after the restated fact, as RULER's answer prefixes do; for
``recall``: the first recalled value), and the score is the share of examples whose answer's tokens
greedy decoding reproduces exactly. For ``copy`` the prompt ends with the repeat's first word (its cue)
and the answer is the ``COPY_TOKENS`` after it (induction: continue what recurs). :func:`answer_loss` is
the smooth companion: the answers' mean cross-entropy given their prompts (teacher-forced), which moves
long before a model answers anything exactly.

This module makes the examples (:meth:`Probe.prompts`: text, no model); :mod:`headprobe.model.answers`
runs a model on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headprobe.core.errors import HeadprobeError
from headprobe.text.tasks import Split, Task, TaskMix, TaskSettings

if TYPE_CHECKING:
    from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer

COPY_TOKENS = 8
PROBE_SEED = 1_000_003  # examples no training seed draws


class TaskProbeError(HeadprobeError, ValueError):
    """A probe that cannot be parsed; the message shows the expected form."""


@dataclass(frozen=True)
class Probe:
    """``samples`` held-out examples of ``task`` with ``distance`` characters between fact and question."""

    task: Task
    distance: int
    samples: int = 16

    @classmethod
    def parse(cls, spec: str) -> Probe:
        m = re.fullmatch(r"(\w+)@(\d+)", spec.strip())
        if not m:
            raise TaskProbeError(f"probe {spec!r}: expected task@distance, e.g. needle@1000")
        try:
            return cls(Task(m.group(1)), int(m.group(2)))
        except HeadprobeError as err:  # an unknown task (a ChoiceError naming the tasks), said with the probe
            raise TaskProbeError(f"probe {spec!r}: {err}") from None

    @property
    def name(self) -> str:
        return f"probe/{self.task.value}@{self.distance}"

    @property
    def loss_name(self) -> str:
        return f"probe_loss/{self.task.value}@{self.distance}"

    def prompts(self, tokenizer: ByteTokenizer | HFTokenizer) -> list[tuple[list[int], list[int]]]:
        """``(prompt ids, answer ids)`` of each example: the text split where its first answer begins."""
        settings = TaskSettings(distance=(self.distance, self.distance), pairs=(1, 3), queries=1, split=Split.HELDOUT)
        mix = TaskMix({self.task: 1.0}, settings)
        out = []
        for i in range(self.samples):
            ex = mix.example(PROBE_SEED, i)
            start, end = ex.loss_spans[0]  # the first answer (needle: the value after the restatement)
            ids, offsets = tokenizer.encode_offsets(ex.text)
            cut = next(j for j, (a, _) in enumerate(offsets) if a >= start)
            stop = next((j for j, (a, _) in enumerate(offsets) if a >= end), len(ids))
            if self.task in (Task.COPY, Task.LIST, Task.REPEAT):
                stop = min(stop, cut + COPY_TOKENS)
            out.append(([tokenizer.eos_id, *ids[:cut]], ids[cut:stop]))
        return out
