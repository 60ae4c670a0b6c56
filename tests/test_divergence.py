"""The trainer's divergence rules (trainer/divergence.py): hand-made metric sequences (a healthy curriculum
whose loss jumps at each level, a collapse to chance, a loss that climbs back, a NaN), the two toy runs of
the shipped recipe whose metrics are recorded in tests/data (toy-k64v16 collapses, toy-d64 does not), and
real tiny training runs: a healthy one is ``trained`` in result.json and the grid's manifest, and a run
continued from a diverged run's weights is ``diverged`` too."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from headprobe.testing import tiny_config
from trainer.config import TrainConfig
from trainer.divergence import DIVERGED, TRAINED, WINDOW, RunStatus, chance_accuracy, moving_means, run_status
from trainer.train import train

DATA = Path(__file__).parent / "data"
WARMUP = 50


def rows(levels: list[tuple[int, float, float, float, float, int | None]], seed: int = 0) -> list[dict]:
    """Logged steps from ``(steps, loss from, loss to, accuracy from, accuracy to, tau)`` per level: each level
    starts at its ``from`` values (a curriculum's jump when it advances) and moves to its ``to`` values,
    linearly over the level (``tau`` None: learning from scratch) or exponentially with time constant ``tau``
    steps (recovering after a jump), with noise of 0.02 on both."""
    rng, out, step = np.random.default_rng(seed), [], 0
    for level, (n, loss0, loss1, acc0, acc1, tau) in enumerate(levels):
        for t in range(n):
            step += 1
            w = 1 - t / n if tau is None else math.exp(-t / tau)
            noise = rng.normal(0, 0.02, 2)
            loss, acc = loss1 + (loss0 - loss1) * w + noise[0], acc1 + (acc0 - acc1) * w + noise[1]
            out.append({"step": step, "loss": loss, "accuracy": min(max(acc, 0.0), 1.0), "level": level})
    return out


def status(metrics: list[dict], vocab: int = 4096, scratch: bool = True):
    return run_status(metrics, WARMUP, chance_accuracy(metrics, vocab, WARMUP, scratch))


def test_moving_means_and_chance_by_hand():
    assert moving_means([1.0, 2.0, 3.0, 4.0], 2) == [1.5, 2.5, 3.5]
    metrics = [{"step": s, "accuracy": 0.5 if s > WARMUP else 0.0} for s in range(1, 100)]
    metrics[WARMUP]["accuracy"] = 0.5 + WINDOW * 0.1  # the first step after warm-up, in the mean
    assert chance_accuracy(metrics, 4096, WARMUP, from_scratch=True) == pytest.approx(0.5 + 0.1)
    assert chance_accuracy(metrics, 4096, WARMUP, from_scratch=False) == 1 / 4096  # a continued run


def test_a_healthy_curriculum_whose_loss_jumps_at_each_level_is_trained():
    # level 0 learns (loss 8 -> 1, accuracy 0 -> 0.8); each advance drops accuracy to 0.1 and sends the loss
    # up to 8 (above the level-0 value after warm-up), then the run recovers within the level
    metrics = rows([(470, 8.3, 1.0, 0.0, 0.8, None), (100, 8.0, 1.5, 0.1, 0.8, 20), (130, 7.0, 2.0, 0.1, 0.6, 20)])
    assert status(metrics) == RunStatus()
    ending_in_a_jump = rows([(470, 8.3, 1.0, 0.0, 0.8, None), (15, 8.0, 6.0, 0.05, 0.06, 20)])  # 15 steps in
    assert status(ending_in_a_jump).status == TRAINED


def test_a_collapse_to_chance_is_diverged_naming_the_rule_and_step():
    # toy-k64v16's shape: learned to 0.8, then at the level advance to chance (0.02 -> 0.1), loss 10 -> 5.4
    metrics = rows([(684, 8.3, 0.9, 0.0, 0.8, None), (116, 10.0, 5.4, 0.02, 0.1, 40)])
    result = status(metrics)
    assert result.status == DIVERGED and result.reason.startswith("training accuracy back to chance")
    since = int(result.reason.split("from step ")[1].split()[0])
    assert 685 <= since <= 685 + WINDOW  # the 20-step mean falls to chance within 20 steps of the advance
    never_learned = rows([(800, 8.3, 6.0, 0.0, 0.1, None)])  # at chance all along: bad, not a collapse
    assert status(never_learned).status == TRAINED


def test_a_loss_back_above_its_early_value_is_diverged_and_nan_is_diverged():
    climbing = rows([(400, 2.0, 1.0, 0.5, 0.6, 80)]) + rows([(400, 1.0, 3.0, 0.6, 0.5, 80)])
    for i, row in enumerate(climbing):  # one run, no curriculum
        row["step"], row["level"] = i + 1, None
    result = status(climbing, scratch=False)
    assert result.status == DIVERGED and result.reason.startswith("training loss back above its early value")
    nan = rows([(300, 8.3, 1.0, 0.0, 0.8, None)])
    nan[200]["loss"] = float("nan")
    assert status(nan) == RunStatus(DIVERGED, "non-finite loss: the training loss was nan at step 201")


def recorded(name: str) -> list[dict]:
    with (DATA / name).open() as f:
        return [{"step": int(r["step"]), "loss": float(r["loss"]), "accuracy": float(r["accuracy"]),
                 "level": int(r["level"])} for r in csv.DictReader(f)]  # fmt: skip


def test_the_recorded_toy_runs_collapse_and_train_as_docs_training_md_says():
    """The shipped toy recipe's pt, seed 0 (metrics.jsonl of 2026-12-07, rounded to 4 digits): toy-k64v16's
    training accuracy falls to chance when its rows grow to 64 tokens (step 685) and stays there; toy-d64 takes
    the same jump at the same advance (step 473) and recovers."""
    k64v16 = status(recorded("metrics_toy-k64v16_s0_pt.csv"))
    assert k64v16.status == DIVERGED and "back to chance" in k64v16.reason and "from step 701" in k64v16.reason
    assert status(recorded("metrics_toy-d64_s0_pt.csv")) == RunStatus()


@pytest.fixture
def model_config(tmp_path) -> Path:
    path = tmp_path / "model.json"
    path.write_text(tiny_config(vocab_size=264, max_seq_len=64).to_json())
    return path


def test_real_runs_record_their_status_and_a_run_from_a_diverged_one_is_diverged(tmp_path, model_config):
    quick = dict(steps=6, batch_size=4, seq_len=64, warmup_steps=1, progress=False, threads=1)
    pt = train(TrainConfig(config=str(model_config), out=str(tmp_path / "pt"), lr=3e-3, **quick))
    assert (pt.status, pt.status_reason) == (TRAINED, None)
    record = json.loads((tmp_path / "pt" / "result.json").read_text())
    assert record["status"] == TRAINED and record["status_reason"] is None and record["eval_loss"] is None
    # as if pt had collapsed: a cpt from its weights is no member's result either
    record.update(status=DIVERGED, status_reason="training accuracy back to chance ...")
    (tmp_path / "pt" / "result.json").write_text(json.dumps(record))
    cpt = train(TrainConfig(stage="cpt", init=str(tmp_path / "pt" / "final"), out=str(tmp_path / "cpt"), **quick))
    assert (
        cpt.status == DIVERGED
        and f"it starts from the weights of {tmp_path / 'pt'}, which diverged" in cpt.status_reason
    )
    assert "training accuracy back to chance ..." in cpt.status_reason and (tmp_path / "cpt" / "final").is_dir()
    assert json.loads((tmp_path / "cpt" / "result.json").read_text())["status"] == DIVERGED
