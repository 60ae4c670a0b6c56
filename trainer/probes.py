"""In-training probes: held-out retrieval accuracy at chosen distances, logged to ``metrics.jsonl``.

A probe ``task@distance`` (``needle@1000``, ``recall@500``, ``copy@300``) draws examples of that task
with keys from the held-out half of the nouns (:mod:`headprobe.text.tasks`) and exactly ``distance``
characters between what is to be retrieved and where it is asked for; the prompt is the text up to the
answer (for ``needle``: up to the value, after the restated fact, as RULER's answer prefixes do; for
``recall``: the first recalled value), and the score is the share of examples whose answer's tokens
greedy decoding reproduces exactly. For ``copy`` nothing tells where a repeat begins, so the prompt
also holds the repeat's first ``COPY_CUE`` tokens and the answer is the ``COPY_TOKENS`` after them
(induction: continue what recurs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.model.transformer import Transformer
from headprobe.text.tasks import Split, Task, TaskMix, TaskSettings
from trainer.config import TrainError

COPY_TOKENS = 8
COPY_CUE = 4
PROBE_SEED = 1_000_003  # examples no training seed draws


@dataclass(frozen=True)
class Probe:
    task: Task
    distance: int
    samples: int = 16

    @classmethod
    def parse(cls, spec: str) -> Probe:
        m = re.fullmatch(r"(\w+)@(\d+)", spec.strip())
        if not m:
            raise TrainError(f"probe {spec!r}: expected task@distance, e.g. needle@1000")
        try:
            return cls(Task(m.group(1)), int(m.group(2)))
        except ValueError as err:
            raise TrainError(f"probe {spec!r}: {err}") from None

    @property
    def name(self) -> str:
        return f"probe/{self.task.value}@{self.distance}"

    def prompts(self, tokenizer: ByteTokenizer | HFTokenizer) -> list[tuple[list[int], list[int]]]:
        """``(prompt ids, answer ids)`` of each example: the text split where its first answer begins."""
        settings = TaskSettings(distance=(self.distance, self.distance), pairs=(1, 3), queries=1, split=Split.HELDOUT)
        mix = TaskMix({self.task: 1.0}, settings)
        out = []
        for i in range(self.samples):
            ex = mix.example(PROBE_SEED, i)
            # needle: the value after the restated fact (the prompt holds the restatement); else the first
            start, end = ex.loss_spans[-1] if self.task is Task.NEEDLE else ex.loss_spans[0]
            ids, offsets = tokenizer.encode_offsets(ex.text)
            cut = next(j for j, (a, _) in enumerate(offsets) if a >= start)
            stop = next((j for j, (a, _) in enumerate(offsets) if a >= end), len(ids))
            if self.task is Task.COPY:
                cut, stop = cut + COPY_CUE, min(stop, cut + COPY_CUE + COPY_TOKENS)
            out.append(([tokenizer.eos_id, *ids[:cut]], ids[cut:stop]))
        return out


@torch.no_grad()
def run_probe(model: Transformer, tokenizer: ByteTokenizer | HFTokenizer, probe: Probe) -> float:
    """The share of the probe's examples answered exactly by greedy decoding."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    hits = 0
    try:
        for prompt, answer in probe.prompts(tokenizer):
            out = model.generate(torch.tensor([prompt], device=device), len(answer))[0].tolist()
            hits += out == answer
    finally:
        model.train(was_training)
    return hits / probe.samples
