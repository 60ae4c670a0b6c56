"""The held-out evaluation loss: the set's rows hold what its docstring says (headprobe/text/heldout.py), the
loss per split equals a dense float64 computation row by row, the trainer logs it every `eval_every` steps
and writes the final weights' into result.json and the grid's manifest without changing training, and the
study carries it into study_runs (measuring it on the checkpoint of a run trained before it existed)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import headprobe.study.job as job
from headprobe.model.checkpoint import load_checkpoint
from headprobe.model.eval_loss import split_losses
from headprobe.model.tokenizer import ByteTokenizer
from headprobe.model.transformer import Transformer
from headprobe.study import measure
from headprobe.testing import tiny_checkpoint, tiny_config
from headprobe.text.heldout import LOCAL, LOCAL_REACH, RETRIEVAL, eval_rows, within_reach
from headprobe.text.tasks import Split, keys
from headprobe.text.toy_tokenizer import open_tokenizer
from trainer.config import TrainConfig
from trainer.grid import run_grid
from trainer.train import train


@dataclass(frozen=True)
class Row:
    ids: tuple[int, ...]
    targets: tuple[bool, ...]
    split: str


def dense_losses(model: Transformer, rows) -> dict[str, float]:
    """Each row alone, unpadded: float64 log-softmax of its logits, summed over its targets, pooled per split."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    model.eval()
    with torch.no_grad():
        for row in rows:
            logp = torch.log_softmax(model(torch.tensor([row.ids]))[0].double(), -1)
            for i in range(1, len(row.ids)):
                if row.targets[i]:
                    sums[row.split] = sums.get(row.split, 0.0) - float(logp[i - 1, row.ids[i]])
                    counts[row.split] = counts.get(row.split, 0) + 1
    out = {"eval_loss": sum(sums.values()) / sum(counts.values())}
    return out | {f"eval_loss_{s}": sums[s] / counts[s] for s in sums}


def test_split_losses_equal_a_dense_float64_computation_row_by_row():
    model = Transformer(tiny_config(vocab_size=264))
    gen = np.random.default_rng(0)
    rows = [
        Row(tuple(int(i) for i in gen.integers(0, 264, n)), tuple(bool(t) for t in gen.random(n) < 0.4), split)
        for n, split in ((5, "a"), (40, "b"), (17, "a"), (9, "b"), (33, "a"), (2, "b"))
    ]
    rows.append(Row((1, 2, 3), (False, False, False), "a"))  # no target: counts nowhere
    model.train()
    got = split_losses(model, rows, batch=3)  # batches of mixed lengths, right-padded
    assert model.training  # left in the mode it was in
    want = dense_losses(model, rows)
    assert got.keys() == want.keys() == {"eval_loss", "eval_loss_a", "eval_loss_b"}
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-5)
    held_out = eval_rows(ByteTokenizer())[::9]  # every section of the real set, as the byte tokenizer cuts it
    got, want = split_losses(model, held_out), dense_losses(model, held_out)
    assert got.keys() == want.keys() == {"eval_loss", "eval_loss_local", "eval_loss_retrieval"}
    assert all(got[name] == pytest.approx(want[name], rel=1e-5) for name in want)


def test_within_reach_is_an_induction_lookup_inside_the_window():
    ids = (0, 5, 6, 7, 5, 6)  # 6 follows 5 three tokens back
    assert within_reach(ids, 5, reach=3) and not within_reach(ids, 5, reach=2)
    assert not within_reach(ids, 4, reach=8)  # 5 after 7: that bigram never occurred
    far = (0, 5, 6, *range(10, 17), 5, 6)  # the bigram 9 tokens back
    assert within_reach(far, 11, reach=9) and not within_reach(far, 11, reach=8)


@pytest.fixture(scope="module")
def toy():
    return open_tokenizer("toy")


def test_the_held_out_set_holds_what_its_docstring_says(toy):
    rows = eval_rows(toy)
    sections = {s: [r for r in rows if r.section == s] for s in dict.fromkeys(r.section for r in rows)}
    assert {s: (len(r), r[0].split) for s, r in sections.items()} == {
        "prose": (8, LOCAL), "list@0": (16, LOCAL), "copy@0": (16, LOCAL),
        "needle@500": (16, RETRIEVAL), "needle@1500": (16, RETRIEVAL),
    }  # fmt: skip
    assert all(r.ids[0] == toy.eos_id and not r.targets[0] for r in rows)
    assert all(all(r.targets[1:]) for r in sections["prose"])  # every prose token counts
    local = [(r, i) for s in ("list@0", "copy@0") for r in sections[s] for i, t in enumerate(r.targets) if t]
    assert len(local) >= 32 and all(r.ids[i] in r.ids[max(0, i - LOCAL_REACH) : i] for r, i in local)
    for distance in (500, 1500):
        for row in sections[f"needle@{distance}"]:
            text = toy.decode(list(row.ids[1:]))
            asked = re.search(
                r"Question: What is the code for the (\w+) (\w+)\? Answer: The code for the \1 \2 is", text
            )
            key, noun = f"{asked.group(1)} {asked.group(2)}", asked.group(2)
            value = re.search(rf"The code for the {key} is (\d+)\.", text).group(1)
            answer = toy.decode([i for i, t in zip(row.ids, row.targets, strict=True) if t])
            assert answer == f" {value}" and noun in keys(Split.HELDOUT)  # the value, with a held-out key
            assert text.index(f"{key} is {value}.") + distance < asked.start()  # the fact, far back
            first = next(i for i, t in enumerate(row.targets) if t)
            assert first - len(toy.encode(text[: text.index(f"{key} is {value}.")])) > 100  # tokens back
    again = eval_rows(open_tokenizer("toy"))  # another tokenizer object of the same file: the same rows
    assert again == rows


def curriculum(tmp_path: Path) -> Path:
    path = tmp_path / "curriculum.json"
    path.write_text(json.dumps({"levels": [{"tasks": {"list": 1}, "distance": [0, 8], "segment": [8, 20]}]}))
    return path


def test_the_trainer_logs_the_held_out_loss_and_writes_the_final_weights_into_result_json(tmp_path, toy):
    model = tmp_path / "model.json"
    model.write_text(tiny_config(vocab_size=4096).to_json())
    quick = dict(config=str(model), tokenizer="toy", curriculum=str(curriculum(tmp_path)), steps=5, batch_size=2,
                 seq_len=64, warmup_steps=1, progress=False, threads=1)  # fmt: skip
    result = train(TrainConfig(out=str(tmp_path / "on"), eval_every=2, **quick))
    logged = [json.loads(line) for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "eval_loss" in r] == [2, 4]
    final = load_checkpoint(tmp_path / "on" / "final")[0]
    want = split_losses(final, eval_rows(toy))  # checked against the dense computation above
    record = json.loads((tmp_path / "on" / "result.json").read_text())
    for name, value in want.items():
        assert getattr(result, name) == record[name] == pytest.approx(value, rel=1e-6)
    off = train(TrainConfig(out=str(tmp_path / "off"), eval_every=0, **quick))
    unlogged = [json.loads(line) for line in (tmp_path / "off" / "metrics.jsonl").read_text().splitlines()]
    assert off.eval_loss is None and not any("eval_loss" in r for r in unlogged)
    assert [r["loss"] for r in unlogged] == [r["loss"] for r in logged]  # evaluating leaves training as it was


def test_the_grid_manifest_and_study_runs_carry_status_and_losses_measured_once_for_an_old_grid(tmp_path, toy):
    recipe = tmp_path / "recipe.json"
    settings = dict(stage="pt", curriculum=str(curriculum(tmp_path)), tokenizer="toy", steps=2, batch_size=2,
                    seq_len=64, warmup_steps=0, eval_every=100, progress=False, threads=1)  # fmt: skip
    recipe.write_text(json.dumps({"scale": "toy", "seeds": [0], "runs": {"pt": settings}}))
    manifest = run_grid(recipe, tmp_path / "runs", ["d16"], log=lambda _: None)
    (entry,) = manifest["runs"]
    record = json.loads((tmp_path / "runs" / "toy-d16" / "s0" / "pt" / "result.json").read_text())
    names = ("status", "status_reason", "eval_loss", "eval_loss_local", "eval_loss_retrieval", "final_loss")
    assert {k: entry[k] for k in names} == {k: record[k] for k in names} and entry["status"] == "trained"
    runs = measure(manifest, tmp_path / "study", parts=[]).tables["study_runs"]
    assert runs.loc[0, "final_curriculum_loss"] == record["final_loss"] and runs.loc[0, "status"] == "trained"
    assert runs.loc[0, "eval_loss_retrieval"] == record["eval_loss_retrieval"]

    # a manifest written before the trainer recorded them: the study measures the final checkpoint, once
    old = tmp_path / "old"
    checkpoint = tiny_checkpoint(old / "toy-a" / "s0" / "pt" / "final", tokenizer=toy, vocab_size=4096)
    before = {"member": "toy-a", "seed": 0, "run": "pt", "stage": "pt", "from": None, "freeze": None,
              "checkpoint": str(checkpoint), "tokens": 10, "steps": 1, "final_loss": 3.0}  # fmt: skip
    runs = measure({"runs": [before]}, tmp_path / "old-study", parts=[]).tables["study_runs"]
    want = split_losses(load_checkpoint(checkpoint)[0], eval_rows(toy))
    assert runs.loc[0, list(want)].to_dict() == pytest.approx(want) and pd.isna(runs.loc[0, "status"])
    measured_again = lambda *_a, **_k: pytest.fail("measured again")  # noqa: E731
    job_load, job.load_checkpoint = job.load_checkpoint, measured_again
    try:
        again = measure({"runs": [before]}, tmp_path / "old-study", parts=[]).tables["study_runs"]
    finally:
        job.load_checkpoint = job_load
    assert again.loc[0, list(want)].to_dict() == pytest.approx(want)
