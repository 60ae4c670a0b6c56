"""Do the trained toys retrieve? A needle probe written here, apart from the training generators.

The trials are built from other text than training saw: haystack sentences of the built-in corpus under
a seed no run uses, three facts whose keys are held-out nouns (one asked for, two distractors) and
distances counted in tokens, far beyond every sliding window (8 tokens) and, at 600, beyond what
pt trained (1,200 characters, about 340 tokens). A trial is a hit when greedy decoding gives the asked value's
tokens exactly.

The probe itself is checked here on every run (an oracle that looks the answer up scores 1, one that
gives a distractor's value scores 0). The trained-model test trains toy-d64 (seeds 0 and 1, one process
each) with the shipped toy recipe's pt, about 2.5 minutes on two cores, so ``make test`` checks that the
recipe still gives a toy that retrieves (one of the two suffices: which seed does depends on the CPU's
float rounding, tests/conftest.py); ``pytest tests/test_toy_retrieval.py --trained RUNS`` probes a study's
``runs`` folder instead (every member's pt checkpoint, e.g. ``results/demo/runs``).
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch

from headprobe.model.tokenizer import ByteTokenizer, HFTokenizer
from headprobe.text.haystack import haystack_sentences
from headprobe.text.tasks import Split, keys

HAYSTACK_SEED = 424_242  # no training run draws the corpus with this seed
ADJECTIVES = ("blue", "quiet", "old", "bright", "narrow", "silver")


def trial(tokenizer, index: int, distance: int) -> tuple[list[int], list[int], str]:
    """``(prompt ids, answer ids, distractor value)``: three facts, then about ``distance`` tokens of
    haystack between the asked fact and the question."""
    rng = random.Random(f"toy-retrieval-{index}")
    nouns = rng.sample(keys(Split.HELDOUT), 3)
    facts = [(f"{rng.choice(ADJECTIVES)} {n}", str(rng.randrange(1000, 10000))) for n in nouns]
    asked = rng.randrange(3)
    sentences = haystack_sentences(HAYSTACK_SEED + index)
    text = " ".join(next(sentences) for _ in range(3))
    for i, (key, value) in enumerate(facts):
        text += f" The code for the {key} is {value}."
        if i == asked:  # the distance starts here; the other facts may fall inside it
            start = len(tokenizer.encode(text))
        text += " " + next(sentences)
    while len(tokenizer.encode(text)) - start < distance:
        text += " " + next(sentences)
    key, value = facts[asked]
    text += f" Question: What is the code for the {key}? Answer: The code for the {key} is"
    ids = tokenizer.encode(text)
    answer = tokenizer.encode(text + f" {value}.")[len(ids) :][:-1]  # the value's tokens, as the model reads them
    assert tokenizer.encode(text + f" {value}.")[: len(ids)] == ids
    return [tokenizer.eos_id, *ids], answer, facts[(asked + 1) % 3][1]


def hit_rate(answer_fn, tokenizer, distance: int, trials: int = 32) -> float:
    """The share of trials where ``answer_fn(prompt_ids, n_tokens)`` gives the answer's ids exactly."""
    hits = 0
    for i in range(trials):
        prompt, answer, _ = trial(tokenizer, i, distance)
        hits += answer_fn(prompt, len(answer)) == answer
    return hits / trials


def _lookup(tokenizer, distractor: bool):
    """A reference 'model' that reads the facts out of the prompt text (or, with ``distractor``, answers
    another fact's value)."""

    def answer(prompt: list[int], n: int) -> list[int]:
        text = tokenizer.decode(prompt[1:])
        key = re.findall(r"The code for the (\w+ \w+) is$", text)[0]
        facts = dict(re.findall(r"The code for the (\w+ \w+) is (\d+)\.", text))
        value = facts[key] if not distractor else next(v for k, v in facts.items() if k != key)
        return tokenizer.encode(text + f" {value}.")[len(prompt) - 1 :][:n]

    return answer


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), "toy"], ids=["byte", "toy-bpe"])
def test_the_probe_scores_an_oracle_one_and_a_distractor_zero(tokenizer):
    from headprobe.text.toy_tokenizer import open_tokenizer

    tok = open_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    for distance in (100, 600):
        assert hit_rate(_lookup(tok, distractor=False), tok, distance, trials=8) == 1.0
        assert hit_rate(_lookup(tok, distractor=True), tok, distance, trials=8) == 0.0
        prompt, answer, _ = trial(tok, 0, distance)
        asked_at = max(i for i in range(len(prompt)) if prompt[i : i + len(answer)] == answer)
        assert len(prompt) - asked_at >= distance  # the answer lies at least `distance` tokens back
    assert len(answer) >= 4 and isinstance(tok, (ByteTokenizer, HFTokenizer))


def _members(runs: Path, run: str) -> list[Path]:
    manifest = json.loads((runs / "manifest.json").read_text())
    return [Path(r["checkpoint"]) for r in manifest["runs"] if r["run"] == run]


TRIALS = 96  # per distance: enough that a retrieving model stands clear of the copy-any-code baseline
CHANCE = 1 / 3  # a model that copies one of the three codes at random (it sees the facts but not which is asked)
ALPHA = 0.01


def binomial_tail(hits: int, trials: int, p: float) -> float:
    """P(X >= hits) for X ~ Binomial(trials, p): the one-sided p-value of ``hits`` under ``p``."""
    return sum(math.comb(trials, k) * p**k * (1 - p) ** (trials - k) for k in range(hits, trials + 1))


def test_the_binomial_tail_matches_hand_worked_values():
    assert binomial_tail(0, 5, 0.3) == pytest.approx(1.0)
    assert binomial_tail(5, 5, 0.5) == pytest.approx(1 / 32)
    assert binomial_tail(2, 3, 0.5) == pytest.approx(4 / 8)  # 3 + 1 of the 8 outcomes


def test_a_trained_toy_retrieves_beyond_every_window(trained_runs):
    """At least one member answers the asked fact 300 and 600 tokens away (far beyond the 8-token window, and
    at 600 beyond the trained distances) far more often than a model that copies one of the three codes at
    random would (1/3; one-sided binomial p < 0.01 at both distances), with a pt checkpoint of the grid. A
    model that cannot see past its window scores about 0. How often it answers moves with a host's float
    rounding (toy-d64 seed 0 at 600 tokens: 75% on one Xeon host, 34% on an AVX2-only EPYC, 45% on an
    AVX-512 EPYC), which is why the grid has two seeds and the bar is a stated baseline, not a share."""
    from headprobe.model.checkpoint import load_checkpoint

    rates = {}
    for ckpt in _members(trained_runs, "pt"):
        model, tok = load_checkpoint(ckpt, dtype=torch.float32)
        model.eval()

        def answer(prompt, n, model=model):
            return model.generate(torch.tensor([prompt]), n)[0].tolist()

        rates[ckpt] = {d: hit_rate(answer, tok, d, trials=TRIALS) for d in (300, 600)}
        print(ckpt, rates[ckpt])

    def beyond_chance(rate: float) -> bool:
        return binomial_tail(round(rate * TRIALS), TRIALS, CHANCE) < ALPHA

    assert any(beyond_chance(r[300]) and beyond_chance(r[600]) for r in rates.values()), rates
